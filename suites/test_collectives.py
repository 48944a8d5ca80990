"""Collectives, checked the way the switches' collective settings promise (HCCL_DETERMINISTIC,
LCCL_DETERMINISTIC, NCCL's algorithm, protocol and channels): all-reduce, reduce-scatter,
all-gather and a fixed-order all-reduce on 4 spawned ranks (HCCL on Ascend, NCCL on CUDA,
gloo on CPU), fp32 and bf16, messages of 1 to 512 rows with widened exponents so that
summation order shows.

Per case: repeat (bits equal run to run), ranks (every rank holds the same all-reduce),
exact (an all-gather moves bits unchanged) and sizes (a row's result the same alone and in a
message of up to 512 rows). ``switch``: the ranks start their process group with exactly
what the target's switch set (read after running it, checked against ``declared.toml``);
``none``: the inverse control, every declared setting removed. Fewer than 3 ranks cannot
show summation order: the size property is then vacuous, never a pass. On an accelerator
runner run this file without ``-n`` (xdist pins each worker's children to one device).

Across nodes (``--ranks-launcher torchrun``): the ranks come from torch's elastic agent on
every node; a mismatch names each rank's node and local rank, and a run whose ranks did not
span the nodes it claims is vacuous, never a pass (docs/collectives.md)."""

from __future__ import annotations

import pytest

from harness.collectives import ops
from harness.collectives.case import run_collective_case, world_for
from harness.collectives.expected import expect, judge_sizes, vacuous, vacuous_nodes
from harness.collectives.ranks import backend_for
from harness.collectives.settings import SETTINGS, declared_settings
from harness.collectives.settings import judge as settings_judge
from harness.invariance import InvarianceTarget
from harness.plugin import SESSION_KEY


@pytest.mark.parametrize("how", SETTINGS)
@pytest.mark.parametrize("collective", list(ops.COLLECTIVES))
def test_collective(invariance_target: InvarianceTarget, collective: str, how: str, request,
                    run_on_npu, record_property) -> None:  # type: ignore[no-untyped-def]
    target = invariance_target
    if target.name == "verl":
        pytest.skip("verl's switch runs vllm-ascend's init, whose collective settings the "
                    "vllm_ascend target's cases check (each verl case starts Ray)")
    if not declared_settings(target):
        pytest.skip(f"{target.name}: {target.release()} declares no collective settings "
                    "(harness/invariance/declared.toml); its collectives are the backend's own")
    session = request.config.stash[SESSION_KEY]
    launch = session.ranks
    world, backend = world_for(session.device.kind, launch), backend_for(session.device.kind)
    budget = target.time_budget(session.timeout)
    got = run_on_npu(run_collective_case, target.name, how, collective, world, backend,
                     launch=launch, env=target.switch_env(how == "switch"),
                     timeout=budget).value
    reading = got["reading"]
    record_property("collective_nodes", sorted(set(got["nodes"].values())))
    record_property("collective_rows", [reading.row(d) for d in reading.dtypes])
    record_property("collective_settings", got["applied"].env)
    release = target.release()
    applied, seen = got["applied"], got["env_at_init"]
    ours = [p for p in settings_judge(applied, release, seen) if p.startswith("rank ")]
    if ours:  # the ranks did not start with what the switch set: the harness's own failure
        pytest.fail("\n- ".join(["", *ours]).lstrip("\n"), pytrace=False)
    problems = settings_judge(applied, release, seen)
    on_backend = [m.sentence(collective) for m in reading.mismatches if m.prop != "sizes"]
    if problems or on_backend:
        if release != target.name and (problems or (how == "switch" and backend != "gloo")):
            record_property("release_finding", release)
        pytest.fail("\n- ".join(["", *problems, *on_backend]).lstrip("\n"), pytrace=False)
    why = vacuous_nodes(got["nodes"], launch.nnodes) or vacuous(reading, backend)
    if why:
        record_property("vacuous", why)
        pytest.fail(why, pytrace=False)
    outcome, message, drift = judge_sizes(reading, expect(backend, collective, how, world))
    if drift:
        record_property("drift", drift)
    if outcome == "fail":
        if how == "switch" and backend != "gloo" and release != target.name:
            # the collectives ran with exactly what the release's switch set
            record_property("release_finding", release)
        pytest.fail(message, pytrace=False)
    if outcome == "xfail":
        pytest.xfail(message)
    if outcome == "record":  # the inverse control: no claim without the settings
        record_property("collective_inverse_control", message)

