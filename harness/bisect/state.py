"""A bisect's state on disk, so that a bisect cut short (its budget, a killed job) resumes
where it stopped: ``state.json`` holds the inputs and every trial, written whole after each
trial; a trial already in it is never rerun. ``bisect.json`` is the outcome the report reads
(``harness.report`` shows it on the failure's card)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bisect.endpoints import BisectInputError
from harness.bisect.trial import Trial
from harness.report.atomic import write_whole

STATE_FILE = "state.json"
#: bisect.json's layout version (2: one outcome per failure group, in ``groups``; 3: a
#: group's boundary confirmation runs in ``confirmed``, the releases that fail another way in
#: ``other_since`` and the search's ``other_*``, a signature's ``statement``)
SCHEMA = 3


def key(assignment: dict[str, str]) -> str:
    return ",".join(f"{dist}=={version}" for dist, version in sorted(assignment.items()))


@dataclass
class State:
    folder: Path
    inputs: dict[str, Any]
    trials: dict[str, Trial] = field(default_factory=dict)
    #: how many trials came from an earlier, interrupted bisect
    resumed: int = 0

    @classmethod
    def open(cls, folder: Path, inputs: dict[str, Any], *, fresh: bool = False) -> State:
        path = folder / STATE_FILE
        if fresh or not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            return cls(folder, inputs)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BisectInputError(f"{path}: unreadable bisect state ({exc}); rerun with "
                                   "--fresh to start over") from None
        if data.get("inputs") != inputs:
            raise BisectInputError(f"{path} holds another bisect (other results, tests or "
                                   "options); use --state DIR for this one, or --fresh to "
                                   "start this one over there")
        trials = {k: Trial.from_dict(v) for k, v in data.get("trials", {}).items()}
        return cls(folder, inputs, trials, resumed=len(trials))

    def save(self) -> None:
        data = {"inputs": self.inputs,
                "trials": {k: t.to_dict() for k, t in self.trials.items()}}
        write_whole(self.folder / STATE_FILE,
                    lambda fh: fh.write(json.dumps(data, indent=1) + "\n"))


def write_outcome(path: Path, outcome: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, lambda fh: fh.write(json.dumps({"schema": SCHEMA, **outcome},
                                                     indent=1) + "\n"))
