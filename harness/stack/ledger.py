"""The ledger of confirmed release findings (``known_findings.toml`` beside this module):
what the verdicts judge a failure by, and what a reproducer and the report name. Below the
pytest face, so that the reproducer and the report read it without loading a plugin."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.stack.requirements import in_range
from harness.stack.upstream import version as installed_version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

LEDGER = Path(__file__).with_name("known_findings.toml")
#: another ledger (a team's own findings, the harness's tests)
LEDGER_ENV = "HARNESS_LEDGER"


@dataclass(frozen=True)
class Finding:
    """One ledger entry."""

    id: str
    title: str
    distribution: str
    affected: str
    cases: tuple[str, ...]
    #: the failure lines the finding shows, each named by a text the line contains: a
    #: failure with a line none of them covers is a new failure (``ledger_match``)
    match: tuple[str, ...]
    evidence: str
    fix: str = ""
    #: other distributions whose range the finding needs: {distribution: specifier} (verl's
    #: patch shows it only on the vLLM it runs its exact compare against)
    also: tuple[tuple[str, str], ...] = ()
    #: where it is tracked upstream once filed (an issue's URL; "" not filed yet:
    #: ``npu-regress repro`` writes the reproducer and the issue body)
    upstream: str = ""
    #: the reproducer recipe of its class (``npu-regress repro``), where it is not the
    #: finding's own (a recipe named by the finding's id)
    recipe: str = ""

    def applies(self, version: str | None,
                versions: Any = installed_version) -> bool:
        """Whether the installed ``version`` of its distribution is an affected release (and
        each ``also`` distribution is in its range)."""
        return in_range(version, self.affected) and all(in_range(versions(d), spec)
                                                        for d, spec in self.also)

    def reason(self, version: str | None) -> str:
        fix = f"; fixed upstream by {self.fix}" if self.fix else ""
        fix += f"; tracked upstream at {self.upstream}" if self.upstream else ""
        also = "".join(f", {d} {s}" for d, s in self.also)
        return (f"known release finding {self.id} ({self.distribution} {version}, ledger "
                f"range {self.affected}{also}): {self.title}{fix}")


class LedgerError(ValueError):
    """A ledger file that cannot be used (named, with the fix)."""


def load_ledger(path: Path | None = None) -> list[Finding]:
    """The ledger: ``path``, else ``$HARNESS_LEDGER``, else the built-in one."""
    path = path or Path(os.environ.get(LEDGER_ENV) or LEDGER)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise LedgerError(f"{path}: cannot read the ledger of known findings ({exc})") from None
    found = []
    for i, entry in enumerate(data.get("finding", [])):
        missing = [k for k in ("id", "title", "distribution", "affected", "cases", "match",
                               "evidence") if k not in entry]
        if missing:
            raise LedgerError(f"{path}: finding #{i + 1} lacks {', '.join(missing)}")
        match = entry["match"]
        match = (match,) if isinstance(match, str) else tuple(match)
        if not match or not all(isinstance(m, str) and m.strip() for m in match):
            raise LedgerError(f"{path}: finding {entry['id']!r}: match must be a text or a "
                              "list of texts, one for each failure line the finding shows")
        found.append(Finding(entry["id"], entry["title"], entry["distribution"],
                             entry["affected"], tuple(entry["cases"]), match,
                             " ".join(entry["evidence"].split()), entry.get("fix", ""),
                             tuple(sorted(dict(entry.get("also", {})).items())),
                             str(entry.get("upstream", "")), str(entry.get("recipe", ""))))
    return found
