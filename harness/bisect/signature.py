"""A failure's signature: the whole statement of a failure, so that "the same failure" means
the same check saying the same things, not one line in common.

A signature is the failure's category and every one of its problem lines, with what varies
from run to run or release to release masked by kind:

- a version only where it is one: a number with two dots or more (``0.24.0``,
  ``2.10.0+cpu``), or a number with one dot right after a package's name, ``==`` or ``v``
  (``torch 2.10``, ``vllm==0.9``); ``max |diff| 0.0002`` is a figure, not a version;
- a figure (any other number) by its order of magnitude, the band a drift is judged in: 2 ULP
  and 7 ULP are one band, 42,161 ULP another; 0 stays 0;
- a memory address, a temporary path and a process id, which no two runs share.

A check declares more of its failure as data: a drift that grew names the figures that left
their envelope (``drift grew: max_ulp ~1e4``), which the signature keeps beside its lines.

Two signatures agree when category and lines are the same; they agree in part when they share
a line but not all; else they differ. Only agreement makes a candidate end "as tonight"."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: how two signatures compare
SAME, PARTLY, DIFFERENT = "same", "partly", "different"

#: names after which a one-dot number is a version (the stacks' packages and the words
#: that announce one); two dots or more are a version anywhere
_VERSION_WORDS = (
    "python|torch|torch_npu|torch-npu|vllm|vllm-ascend|vllm_ascend|verl|sglang|transformers|"
    "tensordict|triton|cann|driver|numpy|ray|flashinfer|version|release")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_TMP = re.compile(r"/tmp/[^\s'\":,)]+")
_PID = re.compile(r"\b(pid|process|rank pid)[ =:]+\d+", re.IGNORECASE)
_DOTTED = re.compile(r"(?<![\w.])v?\d+(\.\d+){2,}([.+-]?(post|dev|rc|a|b|cpu|cu)\w*)*(?![\w.])")
_NAMED = re.compile(rf"(?i)((?<![\w-])(?:{_VERSION_WORDS})\s*(?:[=<>~]=)?\s*v?|[=<>~]=\s*v?)"
                    r"\d+\.\d+\w*(?![\w.])")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(\.\d+)?([eE][-+]?\d+)?(?![\w.])")
VERSION_MASK = "<version>"


def band(value: float) -> str:
    """A figure's order of magnitude: ``~1e4`` for 42,161; ``0`` for zero."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    sign = "-" if value < 0 else ""
    return f"{sign}~1e{math.floor(math.log10(abs(value)))}"


def _band_text(match: re.Match[str]) -> str:
    text = match.group(0).replace(",", "")
    try:
        return band(float(text))
    except ValueError:
        return match.group(0)


def mask(line: str) -> str:
    """One problem line with its versions, addresses, paths and pids masked, and its
    other numbers kept as their order of magnitude."""
    line = _ADDRESS.sub("0x?", line)
    line = _TMP.sub("/tmp/?", line)
    line = _PID.sub(lambda m: f"{m.group(1)} ?", line)
    line = _DOTTED.sub(VERSION_MASK, line)
    line = _NAMED.sub(lambda m: f"{m.group(1)}{VERSION_MASK}", line)
    line = _NUMBER.sub(_band_text, line)
    return " ".join(line.split())


@dataclass(frozen=True)
class Signature:
    """A failure's category and its masked problem lines (and a grown drift's figures)."""

    category: str
    lines: frozenset[str]

    @classmethod
    def of(cls, category: str, lines: Iterable[str],
           grew: Mapping[str, float] | None = None) -> Signature:
        masked = {mask(line) for line in lines if line.strip()}
        masked |= {f"drift grew: {name} {band(value)}" for name, value in (grew or {}).items()}
        return cls(category or "", frozenset(masked))

    def compare(self, other: Signature) -> str:
        """SAME, PARTLY (a line in common, or the same lines under another category) or
        DIFFERENT."""
        if self == other:
            return SAME
        if self.lines & other.lines or self.lines == other.lines:
            return PARTLY
        return DIFFERENT

    def differences(self, other: Signature) -> str:
        """What ``other`` says that this does not, and the reverse: for a PARTLY verdict."""
        parts = []
        if self.category != other.category:
            parts.append(f"category {other.category or 'none'} (tonight "
                         f"{self.category or 'none'})")
        only_here = sorted(other.lines - self.lines)
        only_tonight = sorted(self.lines - other.lines)
        if only_here:
            parts.append("says " + "; ".join(repr(x[:160]) for x in only_here[:3]))
        if only_tonight:
            parts.append("not " + "; ".join(repr(x[:160]) for x in only_tonight[:3]))
        return ", ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {"category": self.category, "lines": sorted(self.lines)}

    @property
    def digest(self) -> str:
        text = "\n".join([self.category, *sorted(self.lines)])
        return hashlib.sha256(text.encode()).hexdigest()[:10]
