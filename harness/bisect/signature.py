"""A failure's signature: the whole statement of a failure, so that "the same failure" means
the same check saying the same things, not one line in common, and not one figure's decade.

A signature is the failure's category and every one of its problem lines, with what varies
from run to run or release to release masked by kind:

- a version only where it is one: a number with two dots or more (``0.24.0``,
  ``2.10.0+cpu``), or a number with one dot right after a package's name, ``==`` or ``v``
  (``torch 2.10``, ``vllm==0.9``); ``max |diff| 0.0002`` is a figure, not a version;
- a memory address, a temporary path and a process id, which no two runs share;
- a figure (any other number) by ``#``: the words decide the identity, the figures its size.

The category is the check's (a stack filed as unsupported, or as the forward profile's, is
still a release's failure: the same statement on a trial's overlaid pairing is the same
failure). A check declares more of its failure as data: a drift that grew names the
figures that left their envelope (``drift grew: max_ulp #``), its size how far over its
bound each went.

Two signatures agree (SAME) when category and words are the same; they agree in part
(PARTLY) when they share a line of words but not all; else they differ. Two that agree are
one failure; where a figure differs by more than ``FACTOR`` (either way) they are "the same
failure, another size" (``other_size`` says both sizes), never another failure: a bug whose
input grew from 64 to 100 values, or whose mismatch went from 8 to 12, is one bug."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


#: categories that file a release's failure by how the stack under it is supported (a
#: trial's overlay pairs an old vLLM with this environment's other packages, which the
#: preflight may not call a pairing), never by what failed: one failure, a release finding's
#: statement, whatever its stack was filed as
_RELEASE_FAILURE = {"unsupported-stack": "release-finding", "forward-compat": "release-finding"}

#: figures within this factor of each other (either way) are the same size (docs/bisect.md)
FACTOR = 4.0
#: what a figure is replaced by in a line's words
FIGURE = "#"


def _figure(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _masked(line: str) -> str:
    """The line with its versions, addresses, paths and pids masked (figures still in)."""
    line = _ADDRESS.sub("0x?", line)
    line = _TMP.sub("/tmp/?", line)
    line = _PID.sub(lambda m: f"{m.group(1)} ?", line)
    line = _DOTTED.sub(VERSION_MASK, line)
    line = _NAMED.sub(lambda m: f"{m.group(1)}{VERSION_MASK}", line)
    return " ".join(line.split())


def split(line: str) -> tuple[str, tuple[float, ...]]:
    """One problem line as its words (versions, addresses, paths and pids masked, every
    other number a ``#``) and its figures, in order."""
    found: list[float] = []

    def take(match: re.Match[str]) -> str:
        value = _figure(match.group(0))
        if value is None:
            return match.group(0)
        found.append(value)
        return FIGURE

    words = _NUMBER.sub(take, _masked(line))
    return words, tuple(found)


def mask(line: str) -> str:
    """One problem line's words: what decides whether two failures are one."""
    return split(line)[0]


def same_size(a: float, b: float, factor: float = FACTOR) -> bool:
    """Two figures within ``factor`` of each other (0 only matches 0; signs must agree)."""
    if a == b:
        return True
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0 or b == 0 or (a < 0) != (b < 0):
        return False
    return max(abs(a), abs(b)) / min(abs(a), abs(b)) <= factor


def fill(words: str, figures: Iterable[float]) -> str:
    """A line's words with its figures put back (for saying a size)."""
    values = iter(figures)
    return re.sub(re.escape(FIGURE), lambda _: _show(next(values, math.nan)), words)


def _show(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.3g}"


def _by_words(sizes: Iterable[tuple[str, tuple[float, ...]]]
              ) -> dict[str, list[tuple[float, ...]]]:
    """A signature's sizes by their line's words (two lines may share their words)."""
    found: dict[str, list[tuple[float, ...]]] = {}
    for words, figures in sizes:
        found.setdefault(words, []).append(figures)
    return found


@dataclass(frozen=True)
class Signature:
    """A failure's category and its problem lines' words (and a grown drift's figure
    names); ``sizes`` are the lines' figures, kept for saying another size, never part of
    the identity (equality, hash and digest)."""

    category: str
    lines: frozenset[str]
    sizes: tuple[tuple[str, tuple[float, ...]], ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, category: str, lines: Iterable[str],
           grew: Mapping[str, float] | None = None) -> Signature:
        """``grew``: a drift's figures that left their envelope, each with how far over its
        bound it went (the value over the bound; the value itself where the bound is 0)."""
        parts = [split(line) for line in lines if line.strip()]
        parts += [(f"drift grew: {name} over its bound by {FIGURE}x", (over,))
                  for name, over in (grew or {}).items()]
        category = _RELEASE_FAILURE.get(category or "", category or "")
        return cls(category, frozenset(words for words, _ in parts), tuple(sorted(parts)))

    def compare(self, other: Signature) -> str:
        """SAME (one failure, whatever its size), PARTLY (a line in common, or the same
        lines under another category) or DIFFERENT."""
        if self == other:
            return SAME
        if self.lines & other.lines or self.lines == other.lines:
            return PARTLY
        return DIFFERENT

    def other_size(self, other: Signature, factor: float = FACTOR) -> str:
        """For two signatures that agree: "" when every figure is within ``factor`` of its
        counterpart, else both sizes of the lines that differ ("'8 of 64' here, '12 of 64'
        there" reads: ``other`` says 8, this says 12)."""
        mine, theirs = _by_words(self.sizes), _by_words(other.sizes)
        said = []
        for words in sorted(set(mine) & set(theirs)):
            for here, there in zip(sorted(theirs[words]), sorted(mine[words]), strict=False):
                if len(here) != len(there) or not all(
                        same_size(a, b, factor) for a, b in zip(here, there, strict=True)):
                    said.append(f"{fill(words, here)!r} there, {fill(words, there)!r} "
                                "tonight")
        return "; ".join(said)

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
        return {"category": self.category, "lines": sorted(self.lines),
                "statement": [fill(words, figures) for words, figures in self.sizes]}

    @property
    def digest(self) -> str:
        text = "\n".join([self.category, *sorted(self.lines)])
        return hashlib.sha256(text.encode()).hexdigest()[:10]
