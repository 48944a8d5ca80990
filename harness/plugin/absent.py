"""One skip per absent target: a target (a batch-invariance target, another implementation
to conform with) that the installed release does not have would skip every one of its
cases with the same reason; a quarter of a suite's skips saying one fact hides the skips
that say something. The cases of an absent target collapse to one: its first case stays and
skips with the reason and the number of cases it stands for, the others are deselected
(pytest counts them as such).

Targets say they are absent through the hook ``pytest_harness_absent_target(item)`` (a
reason, or None; ``harness.plugin.hookspecs``); built in: ``bi_target``
(``InvarianceTarget.unavailable``)."""

from __future__ import annotations

import pytest


class AbsentTargets:
    def __init__(self, device_kind: str, npu_missing: str | None) -> None:
        self.device_kind = device_kind
        self.npu_missing = npu_missing
        #: bi_target name -> its absence (asked once: the vllm target parses its module)
        self._reasons: dict[str, tuple[str, str] | None] = {}

    @pytest.hookimpl(optionalhook=True, trylast=True)
    def pytest_harness_absent_target(self, item: pytest.Item) -> tuple[str, str] | None:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("bi_target") if callspec is not None else None
        if name is None:
            return None
        if name not in self._reasons:
            from harness.invariance import get_target

            reason = get_target(name).unavailable(self.device_kind, self.npu_missing)
            self._reasons[name] = (f"batch-invariance target {name}", reason) \
                if reason else None
        return self._reasons[name]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        groups: dict[tuple[str, str, str], list[pytest.Item]] = {}
        for item in items:
            found = config.hook.pytest_harness_absent_target(item=item)
            if found:
                key = (str(item.path), getattr(item, "originalname", item.name), *found)
                groups.setdefault(key, []).append(item)
        if not groups:
            return
        dropped: set[int] = set()
        for (_, _, target, reason), members in groups.items():
            first, rest = members[0], members[1:]
            count = f"; this one skip stands for its {len(members)} cases" \
                f" ({len(rest)} deselected)" if rest else ""
            first.add_marker(pytest.mark.skip(reason=f"{target}: {reason}{count}"))
            dropped.update(id(m) for m in rest)
        kept = [i for i in items if id(i) not in dropped]
        deselected = [i for i in items if id(i) in dropped]
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
