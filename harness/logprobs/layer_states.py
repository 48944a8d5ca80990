"""Where the engine and the trainer part, layer by layer, on the same tokens.

The dispatch recorder cannot pair an inference engine's ops with a trainer's: vLLM fuses the
q/k/v and gate/up projections and defers each layer's residual add into the next fused
add-rms-norm, transformers does neither. Module boundaries do line up, so both sides are
captured there, with forward hooks, on a prefill of the same tokens:

- the embedding; in each decoder layer the input norm, the attention, the post-attention
  norm and the MLP (each module's own output), and the layer's output: the residual stream.
  vLLM's layer returns (hidden, residual) with the add deferred; their sum is the stream
  transformers' layer returns (IEEE addition commutes, so the two are comparable bit for bit);
- the final norm and the logits (vLLM's ``compute_logits`` on its own final-norm output).

Two readings per boundary. End to end: the engine's state against the trainer's. Local: the
trainer's module given the engine's own input to it (teacher forcing) against the engine's
output, which says which module makes a difference rather than which one inherits it. The
first end-to-end boundary that leaves bit-equality names the layer and the sub-module where
the two sides part; the local reading with the largest relative difference names the module
that moved most (a regression seeded into one module shows there even where the two sides
already part earlier).

The engine side runs inside the engine's process (``engine_states``, vLLM's ``apply_model``
with the engine in-process); a boundary the hooks did not see is reported as not captured,
never as equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness.drift.bits import compare_bits

#: a decoder layer's modules (the same attribute names in vLLM's and transformers' Llama), in
#: the order a token's state passes them, and the names the report uses
SUBMODULES = (("input_layernorm", "input_norm"), ("self_attn", "attention"),
              ("post_attention_layernorm", "post_attention_norm"), ("mlp", "mlp"))


def boundaries(layers: int) -> list[str]:
    """Every boundary, in the order a token's state passes it."""
    names = ["embedding"]
    for i in range(layers):
        names += [f"layer{i}.{name}" for _, name in SUBMODULES] + [f"layer{i}"]
    return [*names, "final_norm", "logits"]


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _stream(out: Any) -> torch.Tensor:
    """vLLM's decoder layer returns (hidden, residual), the add deferred: the stream."""
    return out[0] + out[1] if isinstance(out, tuple) and len(out) == 2 and \
        out[1] is not None else _first(out)


def hook(model: Any, store: dict[str, torch.Tensor], *, deferred_residual: bool
         ) -> list[Any]:
    """Forward hooks on a Llama-shaped model (``model.model.layers``) that keep each boundary's
    output of the first forward call after ``store`` was cleared. Returns the handles."""
    inner = model.model

    def grab(name: str, pick: Any = _first) -> Any:
        def keep(_module: Any, _inputs: Any, out: Any) -> None:
            if name not in store:
                t = pick(out).detach()
                store[name] = (t[0] if t.dim() == 3 else t).clone().cpu()
        return keep

    handles = [inner.embed_tokens.register_forward_hook(grab("embedding")),
               inner.norm.register_forward_hook(grab("final_norm"))]
    for i, layer in enumerate(inner.layers):
        handles.append(layer.register_forward_hook(
            grab(f"layer{i}", _stream if deferred_residual else _first)))
        for attr, name in SUBMODULES:
            handles.append(getattr(layer, attr).register_forward_hook(grab(f"layer{i}.{name}")))
    if not deferred_residual:
        handles.append(model.lm_head.register_forward_hook(grab("logits")))
    return handles


# --- the engine side (vLLM, inside the engine's process) ----------------------------------

_ENGINE_STORE: dict[str, torch.Tensor] = {}
_ENGINE_HANDLES: list[Any] = []


def _install(model: Any) -> int:
    _ENGINE_HANDLES.extend(hook(model, _ENGINE_STORE, deferred_residual=True))
    return len(model.model.layers)


def _remove(_model: Any) -> int:
    for handle in _ENGINE_HANDLES:
        handle.remove()
    _ENGINE_HANDLES.clear()
    return 0


def _logits(model: Any) -> bool:
    if "final_norm" in _ENGINE_STORE:
        _ENGINE_STORE["logits"] = model.compute_logits(_ENGINE_STORE["final_norm"]).cpu()
    return "final_norm" in _ENGINE_STORE


@dataclass
class SeedAttention:
    """A control: one layer's attention output scaled by ``scale`` inside the engine (hooked
    before the capture's hooks, so the capture sees the changed output)."""

    layer: int
    #: 3 %: beyond every module's own difference measured here (bf16's norms: 0.7 %)
    scale: float = 1.0 + 2.0 ** -5

    def __call__(self, model: Any) -> int:
        scale = self.scale
        attention = model.model.layers[self.layer].self_attn
        _ENGINE_HANDLES.append(attention.register_forward_hook(
            lambda _m, _i, out: out * scale))
        return self.layer


def engine_states(llm: Any, params_cls: Any, seqs: list[list[int]], seed_attention: Any = None
                  ) -> dict[str, Any]:
    """Each sequence's boundary states in a vLLM engine (``vllm.LLM`` run in-process, prefix
    caching off: every token is computed), from a prefill of the whole sequence.
    ``seed_attention``: a control's change to one layer's attention (``SeedAttention``)."""
    if seed_attention is not None:
        llm.apply_model(seed_attention)
    layers = llm.apply_model(_install)[0]
    out: list[dict[str, torch.Tensor]] = []
    missing: dict[int, list[str]] = {}  # per sequence: a boundary one of them lacks is named
    try:
        for k, seq in enumerate(seqs):
            _ENGINE_STORE.clear()
            llm.generate([{"prompt_token_ids": list(seq)}],
                         params_cls(max_tokens=1, temperature=0.0), use_tqdm=False)
            llm.apply_model(_logits)
            states = {k: v[:len(seq)] for k, v in _ENGINE_STORE.items()}
            if lost := [b for b in boundaries(layers) if b not in states]:
                missing[k] = lost
            out.append(states)
    finally:
        llm.apply_model(_remove)
    said = "; ".join(f"sequence {k}: {', '.join(lost)}" for k, lost in missing.items())
    return {"layers": layers, "states": out,
            "not_captured": said and f"the engine's hooks saw no {said} (is the engine's "
                                     "model in another process?)"}


# --- the trainer side (transformers) -------------------------------------------------------

@torch.no_grad()
def trainer_states(model: Any, seq: list[int]) -> dict[str, torch.Tensor]:
    """The boundary states of transformers' Llama on one sequence."""
    store: dict[str, torch.Tensor] = {}
    handles = hook(model, store, deferred_residual=False)
    try:
        device = next(model.parameters()).device
        model(input_ids=torch.tensor([seq], device=device))
    finally:
        for handle in handles:
            handle.remove()
    return store


@torch.no_grad()
def local_states(model: Any, engine: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each of the trainer's modules given the engine's own input to it (the engine's state
    at the boundary before), so a module is compared on its own."""
    device = next(model.parameters()).device
    inner = model.model
    n = engine["embedding"].shape[0]

    def run(module: Any, x: torch.Tensor, **kw: Any) -> torch.Tensor:
        return _first(module(x.to(device).unsqueeze(0), **kw))[0].cpu()

    positions = torch.arange(n, device=device).unsqueeze(0)
    out = {"embedding": engine["embedding"]}
    before = engine["embedding"]
    for i, layer in enumerate(inner.layers):
        if f"layer{i}" not in engine:
            break
        name = f"layer{i}"
        out[f"{name}.input_norm"] = run(layer.input_layernorm, before)
        normed = engine[f"{name}.input_norm"].to(device).unsqueeze(0)
        rotary = inner.rotary_emb(normed, positions)
        out[f"{name}.attention"] = _first(layer.self_attn(
            hidden_states=normed, position_embeddings=rotary, attention_mask=None))[0].cpu()
        mid = before + engine[f"{name}.attention"]
        out[f"{name}.post_attention_norm"] = run(layer.post_attention_layernorm, mid)
        out[f"{name}.mlp"] = run(layer.mlp, engine[f"{name}.post_attention_norm"])
        out[name] = mid + engine[f"{name}.mlp"]
        before = engine[name]
    if "final_norm" in engine:
        out["final_norm"] = run(inner.norm, before)
        out["logits"] = run(model.lm_head, engine["final_norm"])
    return out


# --- the comparison ------------------------------------------------------------------------

@dataclass
class Boundary:
    """One boundary over every sequence: end to end, and the trainer's module on the
    engine's input (local)."""

    name: str
    values: int = 0
    differing: int = 0
    max_abs: float = 0.0
    max_ulp: int = 0
    local_differing: int = 0
    local_max_abs: float = 0.0
    local_rel: float = 0.0
    #: captured in every sequence, on both sides (a boundary missing anywhere is "not
    #: captured", never equal)
    captured: bool = True
    #: the sequences where one side had no reading of it, end to end and local
    not_captured_in: list[int] = field(default_factory=list)
    local_not_captured_in: list[int] = field(default_factory=list)

    @property
    def layer(self) -> str:
        """"layer 2" (the decoder layer it belongs to), else the boundary's own name."""
        head = self.name.split(".")[0]
        return f"layer {head.removeprefix('layer')}" if head.startswith("layer") else self.name

    @property
    def module(self) -> str:
        return self.name.split(".", 1)[1] if "." in self.name else (
            "output (the residual stream)" if self.name.startswith("layer") else self.name)


@dataclass
class LayerReport:
    """Where the engine and the trainer part, per boundary, in the order a token passes."""

    engine: str
    trainer: str
    dtype: str
    rows: list[Boundary] = field(default_factory=list)
    not_captured: str = ""

    @property
    def first(self) -> Boundary | None:
        """The first boundary whose end-to-end states leave bit-equality."""
        return next((b for b in self.rows if b.captured and b.differing), None)

    @property
    def largest_local(self) -> Boundary | None:
        """The module whose own output, given the engine's input, differs most (relative)."""
        moved = [b for b in self.rows if b.captured and b.local_differing]
        return max(moved, key=lambda b: b.local_rel) if moved else None

    def sentence(self) -> str:
        if self.not_captured:
            return f"first divergent layer: not captured ({self.not_captured})"
        first = self.first
        if first is None:
            gaps = self.uncaptured(self.rows)
            if gaps:
                return (f"first divergent layer: none among the captured boundaries, but "
                        f"{gaps} not captured: the difference could start there")
            return (f"first divergent layer: none ({len(self.rows)} boundaries bit-equal from "
                    "the embedding to the logits; the difference is the sampler's or the "
                    "decode's)")
        before = self.rows[:self.rows.index(first)]
        equal = [b.name for b in before if b.captured]
        gaps = self.uncaptured(before)
        text = (f"first divergent layer{' seen' if gaps else ''}: {first.layer}, "
                f"{first.module} ({first.differing} of {first.values} values differ, max "
                f"|diff| {first.max_abs:.3g}, {first.max_ulp} ULP; bit-equal before it: "
                f"{', '.join(equal) or 'nothing'}"
                + (f"; not captured before it: {gaps}: the first difference could sit there"
                   if gaps else "") + ")")
        largest = self.largest_local
        if largest is not None:
            text += (f"; given the engine's own inputs, the trainer's modules that differ: "
                     f"{self.local_modules()}; most at {largest.layer}, {largest.module} "
                     f"(relative {largest.local_rel:.3g})")
        return text

    @staticmethod
    def uncaptured(rows: list[Boundary]) -> str:
        """The boundaries among ``rows`` without a reading, each with its sequences."""
        return ", ".join(f"{b.name} (sequence{'s' if len(b.not_captured_in) > 1 else ''} "
                         f"{', '.join(map(str, b.not_captured_in))})"
                         for b in rows if not b.captured)

    def local_modules(self) -> str:
        """The modules that differ on the engine's inputs, by kind: "attention (layers 0-3),
        mlp (layer 2)"."""
        kinds: dict[str, list[str]] = {}
        for b in self.rows:
            if b.captured and b.local_differing:
                kinds.setdefault(b.module, []).append(b.layer.removeprefix("layer "))
        return ", ".join(
            f"{kind} (layer{'s' if len(at) > 1 else ''} {', '.join(at)})"
            if at[0] != kind else kind for kind, at in kinds.items())

    def table(self) -> str:
        lines = [f"{'boundary':28} {'differ':>12} {'max|diff|':>10} {'ULP':>8} "
                 f"{'local differ':>12} {'local rel':>10}"]
        for b in self.rows:
            if not b.captured:
                lines.append(f"{b.name:28} not captured")
                continue
            lines.append(f"{b.name:28} {f'{b.differing}/{b.values}':>12} {b.max_abs:>10.3g} "
                         f"{b.max_ulp:>8} {b.local_differing:>12} {b.local_rel:>10.3g}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        first, largest = self.first, self.largest_local
        return {**asdict(self), "first": first and first.name,
                "largest_local": largest and largest.name, "sentence": self.sentence()}


def compare(engine: list[dict[str, torch.Tensor]], trainer: list[dict[str, torch.Tensor]],
            local: list[dict[str, torch.Tensor]], layers: int, *, engine_name: str = "",
            trainer_name: str = "", dtype: str = "") -> LayerReport:
    """Per boundary, over every sequence: the engine's states against the trainer's (end to
    end) and against the trainer's modules on the engine's inputs (local)."""
    report = LayerReport(engine_name, trainer_name, dtype)
    for name in boundaries(layers):
        row = Boundary(name)
        for k, (e, t, lo) in enumerate(zip(engine, trainer, local, strict=True)):
            if name not in e or name not in t:
                row.not_captured_in.append(k)
                continue
            ref = e[name]
            row.values += ref.numel()
            if name not in lo:  # no local reading: not captured, never the engine's own
                row.local_not_captured_in.append(k)
            for got, is_local in ((t[name], False), *(((lo[name], True),) if name in lo
                                                     else ())):
                differ = compare_bits(ref, got.to(ref.dtype))
                if differ is None:
                    continue
                if is_local:
                    row.local_differing += differ[3]
                    row.local_max_abs = max(row.local_max_abs, differ[1])
                    scale = float(ref.float().abs().max()) or 1.0
                    row.local_rel = max(row.local_rel, differ[1] / scale)
                else:
                    row.differing += differ[3]
                    row.max_abs = max(row.max_abs, differ[1])
                    row.max_ulp = max(row.max_ulp, differ[2])
        row.captured = not row.not_captured_in
        report.rows.append(row)
    return report
