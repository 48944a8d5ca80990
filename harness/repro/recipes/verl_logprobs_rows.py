"""verl-logprobs-rows: a recipe for a class of RL findings, not one ledger entry: verl's
``logprobs_from_logits`` gives a sequence's tokens other bits when the call holds more rows
(the sequences of a bigger micro-batch, packed as verl's engine packs them), so
``old_log_prob`` at one micro-batch size and ``log_prob`` at another differ (verl #6280). A
ledger finding of that kind names it (``recipe = "verl-logprobs-rows"``); the micro-batch rows
of ``suites/test_rl_consistency.py`` (``verl-rmpad``, ``verl-padded``) are its cases. Runs on
a CPU: the function is verl's pure-torch path there."""

from __future__ import annotations

from collections.abc import Mapping

from harness.repro.recipe import Recipe, template

_SCRIPT = '''"""Reproducer: verl's logprobs_from_logits gives one sequence's tokens other bits when
the same call also holds other sequences' rows (old_log_prob vs log_prob at other micro-batch
sizes, verl #6280).

Exit 1 while the bug is there, 0 when fixed, 2 when this script cannot run (verl missing).
`python repro.py --same-size` is the control: the sequence alone twice, which must agree.

Inputs: seeded float32 logits (torch.Generator seed 0, normal x 4: a peaked distribution,
not a flat one) for a sequence of {alone} tokens and {beside} tokens of other sequences,
a vocabulary of {vocab}, random labels; the sequence's logprobs computed alone and inside one
call with the others, as verl's engine calls it on a packed micro-batch.
"""
import sys

ALONE, BESIDE, VOCAB = {alone}, {beside}, {vocab}


def main():
    import torch
    try:
        from verl.utils.torch_functional import logprobs_from_logits
    except ImportError as exc:
        print(f"cannot run: {{exc}} (see requirements.txt)")
        return 2
    same_size = "--same-size" in sys.argv[1:]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(ALONE + BESIDE, VOCAB, generator=gen) * 4
    labels = torch.randint(0, VOCAB, (ALONE + BESIDE,), generator=gen)
    alone = logprobs_from_logits(logits[:ALONE].clone(), labels[:ALONE].clone())
    rows = ALONE if same_size else ALONE + BESIDE
    inside = logprobs_from_logits(logits[:rows].clone(), labels[:rows].clone())[:ALONE]
    differ = (alone.view(torch.int32) != inside.view(torch.int32)).nonzero().flatten()
    print(f"verl {{__import__('verl').__version__}}, torch {{torch.__version__}}: the "
          f"sequence's {{ALONE}} logprobs alone vs inside a call of {{rows}} rows")
    print("expected: the same bits")
    if len(differ):
        i = int(differ[0])
        print(f"observed: {{len(differ)}} of {{ALONE}} differ; first at token {{i}}: "
              f"{{alone[i].item()!r}} alone, {{inside[i].item()!r}} inside")
        return 1
    print("observed: the same bits")
    return 0
'''


def requirements(versions: Mapping[str, str]) -> list[str]:
    """verl as the results' manifest has it; torch's release without its local build tag
    (a CPU runner installs the CPU build of that release)."""
    torch = versions.get("torch", "2.13.0").split("+")[0]
    return [f"torch=={torch}", f"verl=={versions.get('verl', '0.9.1')}"]


RECIPE = Recipe(
    finding="verl-logprobs-rows", script=template(_SCRIPT), requirements=requirements,
    inputs="seeded float32 logits (normal x 4) of one sequence and of other sequences beside "
           "it, random labels; verl's logprobs_from_logits on the sequence alone and inside "
           "one call with the others (a packed micro-batch)",
    expected="the sequence's logprobs have the same bits alone and inside the bigger call",
    observed="the sequence's logprobs change with the rows beside it in the call",
    params={"beside": (284, 96, 64), "alone": (37,), "vocab": (1024, 256)},
    control=("--same-size",), for_class=True)
