"""The trainer as verl runs it: per-token logprobs through verl's own FSDP engine.

verl 0.9.1's actor computes ``old_log_prob`` and ``log_prob`` in ``FSDPEngineWithLMHead``
(``workers/engine/fsdp/transformer_impl.py``): the micro-batches its ``infer_batch`` cuts, the
sequences of one packed into a single row (``use_remove_padding``, the default) or padded to
the longest, the logits divided by the temperature, and ``logprobs_from_logits`` called once on
the micro-batch's (tokens, vocab) logits. ``VerlEngineForward`` builds that engine from a verl
config (FSDP2, one process) on the seeded checkpoint and asks it, the way verl's worker does.
So a change in verl that depends on how many rows its function gets, or on how it packs, is
seen: the loop in ``training.TrainingForward`` only ever gives it one sequence.

On a CPU runner verl finds no device: ``harness.invariance.standin_verl`` gives its platform
registry a CPU entry (gloo, device "cpu"), and nothing of the engine's computation changes.
Deviations from a user's config, written down because a CPU cannot follow it:
``attn_implementation`` is ``sdpa`` (verl's default, flash-attention 2, is CUDA-only; with no
attention mask transformers' sdpa masks a packed row block by block from the position ids, as
flash-attention's varlen kernel does from them), and ``use_torch_compile`` is off.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from harness.logprobs import seeded_model

#: layout -> verl's ``use_remove_padding``
LAYOUTS = {"verl-rmpad": True, "verl-padded": False}
#: verl's actor: mixed precision by dtype (``FSDPEngineConfig.mixed_precision``). bf16 is
#: verl's default (fp32 master weights, bf16 parameters in the forward, bf16 autocast)
MIXED = {"float32": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
         "bfloat16": None}
#: a temperature other than 1, so verl's division of the logits runs (at 1 it is skipped)
TEMPERATURE = 0.7
ENGINE = "verl.workers.engine.fsdp.transformer_impl"


def _process_group() -> None:
    """verl's engine asks torch.distributed for its rank and builds a device mesh: a group of
    one, on verl's backend for the platform (gloo on the CPU stand-in, hccl on Ascend)."""
    import torch.distributed as dist
    from verl.utils.device import get_nccl_backend

    if dist.is_initialized():
        return
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    # a group of one meets nobody: an in-memory store (no file to leave, no port to race for)
    dist.init_process_group(get_nccl_backend(), store=dist.HashStore(), rank=0, world_size=1)


class VerlEngineForward:
    """Per-token logprobs of whole sequences through verl's FSDP engine, micro-batch by
    micro-batch, with or without remove-padding (``LAYOUTS``)."""

    def __init__(self, *, dtype: str = "float32", seed: int = 0, folder: Any = None,
                 remove_padding: bool = True, temperature: float = TEMPERATURE) -> None:
        import verl

        from harness.invariance import standin_verl

        self.platform = standin_verl.install()
        _process_group()
        from verl.trainer.config import CheckpointConfig
        from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
        from verl.workers.engine import EngineRegistry

        if dtype not in MIXED:
            raise ValueError(f"dtype={dtype!r}: use one of {', '.join(MIXED)}")
        self.folder = folder or seeded_model.build(None, seed=seed)
        self.remove_padding = remove_padding
        self.temperature = temperature
        model = HFModelConfig(path=str(self.folder), load_tokenizer=False,
                              use_remove_padding=remove_padding,
                              enable_gradient_checkpointing=False,
                              override_config={"attn_implementation": "sdpa"})
        self.config = FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32",
                                       mixed_precision=MIXED[dtype], use_torch_compile=False,
                                       use_dynamic_bsz=False,
                                       use_remove_padding=remove_padding)
        self.engine = EngineRegistry.new(model_type="language_model", backend="fsdp2",
                                         model_config=model, engine_config=self.config,
                                         optimizer_config=FSDPOptimizerConfig(lr=1e-6),
                                         checkpoint_config=CheckpointConfig())
        self.engine.initialize()
        self.model = self.engine.module
        self.device = torch.device("cpu" if self.platform == "cpu" else self.platform)
        self.digest = seeded_model.weights_digest(self.model)
        self.name = (f"verl {verl.__version__} {type(self.engine).__name__} (fsdp2, "
                     f"use_remove_padding={remove_padding}, temperature {temperature}, "
                     f"{dtype if MIXED[dtype] else 'bf16 mixed precision, verl default'}, "
                     f"sdpa, platform {self.platform}; seeded 4-layer llama) + its "
                     "verl.utils.torch_functional.logprobs_from_logits")

    def batch(self, seqs: list[list[int]], micro_batch: int) -> Any:
        """The TensorDict verl's worker hands its engine for ``compute_log_prob``."""
        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu

        def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
            return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

        data = TensorDict({
            "input_ids": jagged([torch.tensor(s) for s in seqs]),
            "position_ids": jagged([torch.arange(len(s)) for s in seqs]),
            "loss_mask": jagged([torch.ones(len(s), dtype=torch.int64) for s in seqs]),
        }, batch_size=[len(seqs)])
        tu.assign_non_tensor(data, use_remove_padding=self.remove_padding,
                             use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch,
                             use_fused_kernels=False, temperature=self.temperature,
                             calculate_entropy=False)
        return data

    def logprobs(self, seqs: list[list[int]], micro_batch: int, layout: str = ""
                 ) -> list[torch.Tensor]:
        """Each sequence's logprobs of its tokens 1..n-1, as verl's engine returns them (its
        last entry, the rolled label, dropped). ``layout`` must be this engine's own."""
        return self.run(seqs, micro_batch, layout)[0]

    def run(self, seqs: list[list[int]], micro_batch: int, layout: str = "",
            logits: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``logprobs``, and with ``logits`` each sequence's logits at its positions 0..n-2
        as the engine's model gave them (before the temperature), caught by a forward hook
        on the model: what a full-distribution comparison needs and verl does not return."""
        if layout and LAYOUTS.get(layout) is not self.remove_padding:
            raise ValueError(f"layout={layout!r}: this engine was built with "
                             f"use_remove_padding={self.remove_padding}")
        if len(seqs) % micro_batch:
            raise ValueError(f"micro_batch={micro_batch}: verl needs it to divide the "
                             f"{len(seqs)} sequences")
        caught: list[torch.Tensor] = []

        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            caught.append(output.logits.detach().float().cpu())

        handle = self.model.register_forward_hook(hook) if logits else None
        try:
            with self.engine.eval_mode():
                out = self.engine.infer_batch(self.batch(seqs, micro_batch),
                                              loss_function=None)
        finally:
            if handle is not None:
                handle.remove()
        rows = [row[:-1].float().cpu() for row in out["model_output"]["log_probs"].unbind()]
        return rows, self._split(caught, seqs, micro_batch)

    def _split(self, caught: list[torch.Tensor], seqs: list[list[int]], micro_batch: int
               ) -> list[torch.Tensor]:
        """Per sequence, from each micro-batch's logits: a packed row cut at the sequences'
        lengths (remove-padding), or a padded batch's rows to each length."""
        out: list[torch.Tensor] = []
        for chunk, logits in zip((seqs[i:i + micro_batch]
                                  for i in range(0, len(seqs), micro_batch)), caught,
                                 strict=False):
            offset = 0
            for j, seq in enumerate(chunk):
                if self.remove_padding:
                    out.append(logits[0, offset:offset + len(seq) - 1])
                    offset += len(seq)
                else:
                    out.append(logits[j, :len(seq) - 1])
        return out

def unavailable() -> str | None:
    """Why verl's engine cannot run in this environment (None: it can)."""
    from harness.stack.devices import has_module

    missing = [m for m in ("verl", "tensordict", "transformers") if not has_module(m)]
    return (f"{', '.join(missing)} not installed (bash ci/setup.sh --upstream installs "
            "verl and what it declares)") if missing else None
