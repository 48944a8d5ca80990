"""Ranks across nodes (issue 60), as two nodes on loopback: two torchrun agents (torch's
elastic agent, c10d rendezvous) of 2 gloo ranks each, node 1 under a host name of its own.

- the suite's case passes on 4 ranks over 2 nodes and records both nodes;
- a rank on node 1 that holds another sum than node 0's ranks is named by node and rank;
- a rank killed, raising or hung on node 1 is named with its node, and no process the check
  started is left on either node;
- a fleet's other node (``npu-regress ranks-node --serve``) takes one job after another;
- a run whose ranks did not span the nodes it claims is vacuous, and bad options are usage
  errors naming the option.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import psutil
import pytest

from harness.collectives import expected, properties
from harness.collectives.launchers import LaunchSpec, get
from harness.collectives.launchers.protocol import PET
from harness.collectives.launchers.torchrun import LOOPBACK_NAME, TorchrunLauncher, as_node
from harness.collectives.ranks import RankError, node_id
from harness.stack.network import free_port

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 2, 3, 7)
TWO_NODES = LaunchSpec("torchrun", nnodes=2, nproc_per_node=2, loopback=True)
#: Ray's own two nodes on one host: a head and a worker raylet, each its own node id
RAY_NODES = LaunchSpec("ray", nnodes=2, nproc_per_node=2, loopback=True)
NODE1 = LOOPBACK_NAME.format(k=1)


def _ray() -> None:
    pytest.importorskip("ray", reason="Ray is not installed (the default profile has it)")


@pytest.mark.parametrize("spec", [TWO_NODES, RAY_NODES], ids=["torchrun", "ray"])
def test_a_rank_on_node_1_with_another_sum_is_named_by_node_and_rank(spec: LaunchSpec
                                                                     ) -> None:
    if spec.kind == "ray":
        _ray()
    got = get(spec).run(properties.measure, ("node_skewed_all_reduce", ("float32",),
                                                  SIZES), world=4, backend="gloo", timeout=60)
    assert [(r.rank, r.node_rank, r.local_rank) for r in got] == \
        [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    if spec.kind == "torchrun":
        assert {r.node for r in got} == {node_id(), NODE1}
    assert len({r.node for r in got[:2]} | {r.node for r in got[2:]}) == 2
    places = {r.rank: f" on {r.place()}" for r in got}
    reading = properties.read("node_skewed_all_reduce", 4, [r.value for r in got], SIZES,
                              ("float32",), places=places)
    named = {m.rank for m in reading.of("ranks")}
    assert named == {2, 3}, reading.mismatches  # node 1's ranks, and only them
    sentence = reading.of("ranks")[0].sentence("node_skewed_all_reduce")
    assert f"rank 2 on node {got[2].node} (node rank 1, local rank 0) holds other bits than " \
           f"rank 0 on node {got[0].node} (node rank 0, local rank 0)" in sentence, sentence
    assert expected.vacuous_nodes({r.rank: r.node for r in got}, 2) is None


def _pid(folder: str, rank: int) -> None:
    Path(folder, f"pid{rank}").write_text(str(os.getpid()))


def _fails_on_node_1(rank: int, world: int, folder: str, how: str) -> None:
    import torch
    import torch.distributed as dist

    _pid(folder, rank)
    dist.all_reduce(torch.ones(4))
    if rank == 3:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "raise":
            raise ValueError("rank 3's own error")
        time.sleep(600)
    dist.all_reduce(torch.ones(4))


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _started_by(job_pids: list[int], before: set[int]) -> list[psutil.Process]:
    """Processes of this test's job still running: its ranks (on either node), and any
    process this test started that lives on (a node's agent); ``before``: this process's
    descendants before the test (an xdist worker's isolation server is one)."""
    left = []
    mine = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in [*map(_process, job_pids), *mine]:
        if proc is None:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            left.append(proc)
        except psutil.Error:
            continue
    return left


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


@pytest.mark.parametrize(("how", "says"), [
    ("kill", f"rank 3 of 4 (gloo) on node {NODE1} (node rank 1, local rank 1) was killed by "
             "SIGKILL"),
    ("raise", f"rank 3 of 4 (gloo) on node {NODE1} (node rank 1, local rank 1) exited with "
              "status 1: ValueError: rank 3's own error"),
    ("hang", f"rank 3 of 4 (gloo) on node {NODE1} (node rank 1, local rank 1) hung: after 6 s "
             "it was at"),
])
def test_a_rank_failing_on_node_1_is_named_and_nothing_is_left(how: str, says: str,
                                                               tmp_path: Path) -> None:
    _fails_and_is_named(TWO_NODES, how, says, tmp_path)


@pytest.mark.parametrize(("how", "says"), [
    ("kill", "died (its process ended without a result)"),
    ("raise", "raised: ValueError: rank 3's own error"),
])
def test_a_ray_rank_failing_on_node_1_is_named_and_nothing_is_left(how: str, says: str,
                                                                   tmp_path: Path) -> None:
    _ray()
    _fails_and_is_named(RAY_NODES, how, says, tmp_path)


def test_a_ray_rank_whose_group_did_not_start_raised_and_is_not_called_dead() -> None:
    """Seen on CI: rank 0's group start raised, the actor's method then raised outside its
    own catch, and Ray's task error was read as a death ("died (its process ended without a
    result)"), the error itself lost. Every rank here fails to start its group (a backend
    torch does not have): each raised, with torch's own words, and none died. One node of
    two ranks: the fault was in every rank, and a second raylet costs seconds."""
    _ray()
    with pytest.raises(RankError) as caught:
        get(LaunchSpec("ray", nnodes=1, nproc_per_node=2, loopback=True)).run(
            _fails_on_node_1, ("", "raise"), world=2, backend="no-such-backend", timeout=60)
    text = str(caught.value)
    first = text.splitlines()[0]
    assert " raised: " in first and "no-such-backend" in first, text
    assert "died" not in text, text


def _fails_and_is_named(spec: LaunchSpec, how: str, says: str, tmp_path: Path) -> None:
    before = _descendants()
    # a hang's limit 6 s; a death's ample: under CI's load a Ray actor's death once took
    # longer than 6 s to be seen, and the run was called a hang
    with pytest.raises(RankError) as caught:
        get(spec).run(_fails_on_node_1, (str(tmp_path), how), world=4, backend="gloo",
                      timeout=6 if how == "hang" else 60)
    text = str(caught.value)
    if spec.kind == "ray":  # the node is Ray's node id: named, on node 1
        assert caught.value.rank == 3 and text.startswith("rank 3 of 4 (gloo) on node "), text
        assert f" (node rank 1, local rank 1) {says}" in text.splitlines()[0], text
    else:
        assert caught.value.rank == 3 and text.startswith(says), text
    if how == "hang":  # the others named where they waited, on both nodes
        assert "ranks 0, 1, 2 waited at" in text.splitlines()[0], text
        assert f"--- rank 0 on node {node_id()} (node rank 0, local rank 0) ---" in text
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    assert len(pids) == 4, pids
    assert _started_by(pids, before) == []


def test_a_node_whose_agent_failed_after_a_rank_does_not_hide_the_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on CI: node 1's agent ended with its failed rank, then node 0's agent raised
    ``RendezvousConnectionError``. The cause is what failed first: rank 3, with node 0's
    lost rendezvous said after it; the control, node 0's agent failing first, names node 0.
    The nodes' reports are the real ones of a run where rank 3 raised, node 0's made as its
    agent gives it then (no values, no failures, the agent's error at a time of its own)."""
    import copy

    from harness.collectives.launchers import torchrun

    real, seen = TorchrunLauncher._collect, []

    def collect(self: TorchrunLauncher, *args: object, **kwargs: object) -> dict:
        reports = real(self, *args, **kwargs)
        seen.append(copy.deepcopy(reports))
        return reports

    monkeypatch.setattr(TorchrunLauncher, "_collect", collect)
    with pytest.raises(RankError):
        get(TWO_NODES).run(_fails_on_node_1, (str(tmp_path), "raise"), world=4,
                           backend="gloo", timeout=60)
    first = min(f["failed_at"] for f in seen[0][1]["failures"].values())
    lost = "RendezvousConnectionError: The connection to the C10d store has failed."
    for after in (0.5, -0.5):
        reports = copy.deepcopy(seen[0])
        reports[0].update(values={}, failures={}, error=lost, error_at=first + after)
        with pytest.raises(RankError) as caught:
            torchrun._results(reports, 4, "gloo", 60)
        lines = str(caught.value).splitlines()
        if after > 0:
            assert caught.value.rank == 3, lines
            assert lines[0].startswith(f"rank 3 of 4 (gloo) on node {NODE1} (node rank 1, "
                                       "local rank 1) exited with status 1: ValueError"), lines
            assert f"  then node 0 ({node_id()}) could not run its ranks: {lost}" in lines, \
                lines
        else:
            assert caught.value.rank == 0, lines
            assert lines[0] == f"node 0 of 2 ({node_id()}) could not run its ranks: {lost}", \
                lines


def _serve(store_port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "harness", "ranks-node", "--serve", "--store",
           f"127.0.0.1:{store_port}", "--node-rank", "1", "--idle-exit", "30"]
    cmd, env = as_node(NODE1, cmd, dict(os.environ))
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_a_fleet_node_serves_one_job_after_another() -> None:
    """Node 1 as a fleet runs it: ``npu-regress ranks-node --serve`` started on its own, the
    checks on node 0 at a fixed endpoint; two jobs, the second the cross-node control."""
    store_port = free_port()
    spec = LaunchSpec("torchrun", nnodes=2, nproc_per_node=2,
                      rdzv_endpoint=f"127.0.0.1:{free_port()}", store_port=store_port)
    server = _serve(store_port)
    try:
        first = get(spec).run(properties.measure, ("fixed_order_all_reduce", ("float32",),
                                                   SIZES), world=4, backend="gloo",
                              timeout=60)
        second = get(spec).run(properties.measure, ("node_skewed_all_reduce", ("float32",),
                                                    SIZES), world=4, backend="gloo",
                               timeout=60)
    finally:
        server.terminate()
        server.wait(30)
    assert {r.node for r in first} == {node_id(), NODE1}
    fine = properties.read("fixed_order_all_reduce", 4, [r.value for r in first], SIZES,
                           ("float32",))
    assert fine.mismatches == []
    skewed = properties.read("node_skewed_all_reduce", 4, [r.value for r in second], SIZES,
                             ("float32",))
    assert {m.rank for m in skewed.of("ranks")} == {2, 3}


def test_the_suite_case_passes_on_two_nodes_and_records_them(tmp_path: Path) -> None:
    """The suite's own case, through pytest: 4 ranks on 2 loopback nodes."""
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_collectives.py", "-p", "no:cacheprovider",
         "-q", "--bi-target", "reference", "-k", "fixed_order_all_reduce and switch",
         "--ranks-launcher", "torchrun", "--ranks-nnodes", "2", "--ranks-nproc-per-node", "2",
         "--ranks-loopback", f"--junitxml={junit}",
         f"--harness-results={tmp_path / 'results.jsonl'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    case = ElementTree.parse(junit).getroot().find(".//testcase")
    assert case is not None and case.find("failure") is None and case.find("skipped") is None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["collective_nodes"] == str(sorted({node_id(), NODE1})), props
    assert "fixed_order_all_reduce float32 x4: sizes 0 of 11 differ" in \
        props["collective_rows"], props
    # issue 69: the results file keeps them too (they reached the JUnit XML only), and the
    # report's reader gives a card its "ran on nodes" line, read from this run's own file
    from harness.report.load import load_results
    from harness.report.page import _properties_text

    [line] = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()
              if json.loads(x)["type"] == "test"]
    assert line["properties"]["collective_nodes"] == sorted({node_id(), NODE1}), line
    [res] = load_results(tmp_path / "results.jsonl").tests.values()
    assert f"ran on nodes: {json.dumps(sorted({node_id(), NODE1}))}" in \
        _properties_text(res.properties)


def test_ranks_on_fewer_nodes_than_claimed_are_vacuous() -> None:
    why = expected.vacuous_nodes({0: "a", 1: "a", 2: "a", 3: "a"}, 2)
    assert why and why.startswith("vacuous: 2 nodes claimed (--ranks-nnodes), but the "
                                  "group's 4 ranks ran on 1 (a)")
    assert expected.vacuous_nodes({0: "a", 1: "a"}, 1) is None


def test_options_fall_back_to_torchrun_s_variables_and_bad_ones_name_the_fix() -> None:
    env = {PET["nnodes"]: "2", PET["nproc_per_node"]: "4", PET["rdzv_endpoint"]: "10.0.0.1:29400",
           PET["node_rank"]: "0"}
    spec = LaunchSpec.from_options("torchrun", None, None, None, None, None, False, env)
    assert (spec.nnodes, spec.nproc_per_node, spec.world) == (2, 4, 8)
    assert spec.host_port() == ("10.0.0.1", 29400) and spec.results_port() == 29401
    assert LaunchSpec.from_options(None, None, None, None, None, None, False, env).kind == \
        "spawn"
    for args, says in [
        ((None, 4, "h:1", 0), "--ranks-nnodes None (or $PET_NNODES): give a whole number"),
        ((2, 4, "nohost", 0), "--ranks-rdzv-endpoint 'nohost'"),
        ((2, 4, "h:1", 1), "--ranks-node-rank 1: the checks run on node 0"),
    ]:
        with pytest.raises(ValueError) as caught:
            LaunchSpec.from_options("torchrun", *args, None, False, {})
        assert str(caught.value).startswith(says), str(caught.value)


def _skewed_alone_on_node_1(rank: int, world: int, *args: object) -> object:
    """Ranks on node 1 measure the row alone one ULP off, their messages right: only the
    size property read on every rank (not rank 0's alone) can see it."""
    import torch

    value = properties.measure(rank, world, *args)
    if int(os.environ.get("GROUP_RANK", "0")) == 1:
        for table in value.values():
            table["alone"] = {p: torch.nextafter(x, torch.full_like(x, float("inf")))
                              for p, x in table["alone"].items()}
    return value


def test_the_size_property_is_read_on_every_rank_by_node() -> None:
    got = get(TWO_NODES).run(_skewed_alone_on_node_1, ("fixed_order_all_reduce",
                                                       ("float32",), SIZES),
                             world=4, backend="gloo", timeout=60)
    places = {r.rank: f" on {r.place()}" for r in got}
    reading = properties.read("fixed_order_all_reduce", 4, [r.value for r in got], SIZES,
                              ("float32",), places=places)
    assert {m.rank for m in reading.of("sizes")} == {2, 3}, reading.mismatches
    assert reading.of("ranks") == []  # the messages agree: only the rows alone moved
    sentence = reading.of("sizes")[0].sentence("fixed_order_all_reduce")
    assert f"row 0 on rank 2 on node {NODE1} (node rank 1, local rank 0): differs from the " \
           "row alone" in sentence, sentence
