"""The plugin's command-line options and ini keys (``pytest --help``, group npu-regress),
and reading them back: a value given on the command line wins over its ini key. Bad values
are usage errors that name the option and the fix, raised before any process starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.collectives.launchers import LaunchSpec
from harness.collectives.launchers.protocol import KINDS as LAUNCH_KINDS
from harness.invariance import BUILTIN_TARGETS
from harness.isolation.server import DEFAULT_PRELOAD
from harness.stack.devices import KINDS

DEFAULT_TIMEOUT_S = 180.0
#: below this many run_on_npu tests a session's forkserver preloads DEFAULT_PRELOAD only,
#: whatever the ini lists (measured: one hardware conformance case under this project's
#: ini list 8.8 s, with torch, pytest and harness only 3.3 s)
PRELOAD_MIN_TESTS = 2
ISOLATION_CHOICES = ("auto", "spawn", "forkserver")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("npu-regress", "npu-regress: isolated hardware-regression checks")
    group.addoption(
        "--device", dest="harness_device", choices=("auto", *KINDS), default=None,
        help="device the isolated children run on: auto (NPU if torch_npu sees one, else "
        "CUDA, else CPU), npu, cuda or cpu. Default: ini harness_device, else auto.",
    )
    group.addoption(
        "--device-count", dest="harness_device_count", type=int, default=None, metavar="N",
        help="number of devices to spread xdist workers over (worker k -> device k mod N), "
        "instead of the detected count; also skips the availability probe for --device.",
    )
    group.addoption(
        "--isolation-timeout", dest="harness_isolation_timeout", type=float, default=None,
        metavar="SECONDS",
        help="seconds an isolated child may run before its stacks are taken and its process "
        "group is ended. Default: ini harness_isolation_timeout, else 180. Per test: "
        "@pytest.mark.isolation_timeout(seconds).",
    )
    group.addoption(
        "--isolation", dest="harness_isolation", choices=ISOLATION_CHOICES, default=None,
        help="how isolated children start: forkserver (forked from a server that preloaded "
        "torch: ~ms per check; env vars read at import time are fixed), spawn (a fresh "
        "interpreter per check), or auto (forkserver, else spawn with a warning). "
        "Default: ini harness_isolation, else auto.",
    )
    group.addoption(
        "--isolation-preload", dest="harness_isolation_preload", default=None,
        metavar="MODULES",
        help="comma-separated modules the forkserver imports before serving; a trailing ? "
        "makes one optional (skipped where it is not installed: transformers?). Default: "
        f"ini harness_isolation_preload, else {','.join(DEFAULT_PRELOAD)}.",
    )
    group.addoption(
        "--bi-target", dest="bi_targets", action="append", default=None, metavar="NAME",
        help="batch-invariance target to check (repeatable): "
        f"{', '.join(BUILTIN_TARGETS)}, or one added through the "
        "npu_regress.invariance_targets entry points. Default: every known target; those "
        "that cannot run here skip with the reason.",
    )
    group.addoption(
        "--harness-results", dest="harness_results", default=None, metavar="PATH",
        help="write one JSON line per finished test (plus a run header and footer) to PATH. "
        "Default: ini harness_results; `pytest suites/` defaults to "
        "reports/latest/results.jsonl. Empty: off.",
    )
    group.addoption(
        "--harness-runner", dest="harness_runner", default=None, metavar="NAME",
        help="runner name recorded in the results file (default: $HARNESS_RUNNER, else the "
        "host name)",
    )
    group.addoption(
        "--isolate-all", dest="harness_isolate_all", action="store_true", default=False,
        help="run every test's call phase in a fresh process (as @pytest.mark.isolated "
        "does): the test function with its resolved fixture values, which must pickle",
    )
    group.addoption(
        "--harness-require", dest="harness_require", default=None, metavar="NAME[,NAME...]",
        help="capabilities this runner must have: npu, torch_npu, vllm, vllm_ascend, verl, "
        "batch_invariant_ops, cann>=VERSION, driver>=VERSION. A test that skips because "
        "one is missing fails, naming it, and a missing one fails the run. Default: ini "
        "harness_require (none).",
    )
    group.addoption(
        "--harness-baselines", dest="harness_baselines", default=None, metavar="DIR",
        help="this runner's own envelopes, a folder in your repository that `npu-regress "
        "expectations learn/update` writes and you commit: its rows are judged before the "
        "tables shipped in the package. Default: ini harness_baselines, else "
        "$NPU_REGRESS_BASELINES, else baselines/ beside the ini file where it exists.",
    )
    ranks = parser.getgroup("npu-regress ranks", "npu-regress: where a collectives check's "
                            "ranks run (torchrun's options, also read from its PET_* variables)")
    ranks.addoption(
        "--ranks-launcher", dest="ranks_launcher", choices=LAUNCH_KINDS, default=None,
        help="spawn (default): the ranks are children of the check on this machine; "
        "torchrun: torch's elastic agent on every node (c10d rendezvous at "
        "--ranks-rdzv-endpoint), the other nodes running `npu-regress ranks-node --serve`; "
        "ray: Ray actors on the nodes of the cluster at --ranks-ray-address.")
    ranks.addoption("--ranks-nnodes", dest="ranks_nnodes", type=int, default=None, metavar="N",
                    help="nodes in the group (torchrun --nnodes; $PET_NNODES)")
    ranks.addoption("--ranks-nproc-per-node", dest="ranks_nproc_per_node", type=int,
                    default=None, metavar="N",
                    help="ranks per node (torchrun --nproc-per-node; $PET_NPROC_PER_NODE)")
    ranks.addoption("--ranks-rdzv-endpoint", dest="ranks_rdzv_endpoint", default=None,
                    metavar="HOST:PORT",
                    help="node 0's rendezvous address, this machine's (torchrun "
                    "--rdzv-endpoint; $PET_RDZV_ENDPOINT)")
    ranks.addoption("--ranks-node-rank", dest="ranks_node_rank", type=int, default=None,
                    metavar="K", help="must be 0: the checks run on node 0 (torchrun "
                    "--node-rank; $PET_NODE_RANK)")
    ranks.addoption("--ranks-store-port", dest="ranks_store_port", type=int, default=None,
                    metavar="PORT", help="port of node 0's job and results store (default: "
                    "the rendezvous port + 1)")
    ranks.addoption("--ranks-ray-address", dest="ranks_ray_address", default=None,
                    metavar="ADDRESS", help="the Ray cluster (default auto: $RAY_ADDRESS, "
                    "else the one started on this machine)")
    ranks.addoption("--ranks-loopback", dest="ranks_loopback", action="store_true",
                    default=False,
                    help="start every node's agent on this machine, each under a host name "
                    "of its own (a dry run of a fleet; free ports unless an endpoint is given)")
    parser.addini("harness_results", "default for --harness-results", default="")
    parser.addini("harness_require", "default for --harness-require", default="")
    parser.addini("harness_device", "default for --device", default="auto")
    parser.addini("harness_baselines", "default for --harness-baselines", default="")
    parser.addini("harness_isolation", "default for --isolation", default="auto")
    parser.addini("harness_isolation_preload", "default for --isolation-preload",
                  default=",".join(DEFAULT_PRELOAD))
    parser.addini("harness_isolation_preload_min",
                  "the ini's harness_isolation_preload applies to a session that collects at "
                  "least this many run_on_npu tests; one with fewer preloads torch, pytest and "
                  "harness only (a preload pays for itself across children, and one child "
                  f"pays for what it never imports). Default {PRELOAD_MIN_TESTS}",
                  default=str(PRELOAD_MIN_TESTS))
    parser.addini("harness_isolation_timeout", "default for --isolation-timeout",
                  default=str(DEFAULT_TIMEOUT_S))


def option(config: pytest.Config, name: str) -> Any:
    """The command-line value of ``name``, else its ini key's."""
    value = config.getoption(name)
    return config.getini(name) if value is None else value


def baselines_folder(config: pytest.Config) -> Path | None:
    """The run's baselines folder (``--harness-baselines``, ini ``harness_baselines``, else
    ``$NPU_REGRESS_BASELINES``, else ``baselines/`` beside the ini file where it exists),
    relative names from the ini file's folder; a path that is not a folder is a usage
    error naming it."""
    import os

    from harness.drift.baselines import DEFAULT_FOLDER, ENV

    given = option(config, "harness_baselines") or os.environ.get(ENV, "")
    base = Path(config.inipath).parent if config.inipath else config.rootpath
    if not given:
        default = base / DEFAULT_FOLDER
        return default if default.is_dir() else None
    folder = Path(given) if Path(given).is_absolute() else base / given
    if folder.exists() and not folder.is_dir():
        raise pytest.UsageError(f"--harness-baselines / harness_baselines = {given!r}: "
                                f"{folder} is not a folder; name the folder of your "
                                "repository that holds the runner's envelopes")
    return folder


def positive_timeout(value: Any) -> float:
    """--isolation-timeout / harness_isolation_timeout as seconds > 0: a zero or negative
    limit would fail every check "still running after -5 s"."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise pytest.UsageError(
            f"--isolation-timeout / harness_isolation_timeout = {value!r}: give a number of "
            f"seconds greater than 0 (default {DEFAULT_TIMEOUT_S:g})")
    return seconds


def device_count(config: pytest.Config) -> int | None:
    count = config.getoption("harness_device_count")
    if count is not None and count < 1:
        raise pytest.UsageError(
            f"--device-count {count}: the number of devices must be 1 or more (leave the "
            "option out to use the detected count)")
    return count


def isolation_method(config: pytest.Config) -> str:
    method = option(config, "harness_isolation")
    if method not in ISOLATION_CHOICES:
        raise pytest.UsageError(
            f"harness_isolation = {method!r}: use one of {', '.join(ISOLATION_CHOICES)}")
    return method


def preload_min_tests(config: pytest.Config) -> int:
    """``harness_isolation_preload_min``, a whole number >= 0."""
    raw = config.getini("harness_isolation_preload_min")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise pytest.UsageError(f"harness_isolation_preload_min = {raw!r}: give a whole number "
                                f">= 0 (0: the ini's preload always; default {PRELOAD_MIN_TESTS})")
    return value


def preload(config: pytest.Config) -> tuple[tuple[str, ...], bool]:
    """The forkserver's preload list, and whether the user chose it (kept under a warm-up)."""
    modules = tuple(m.strip() for m in option(config, "harness_isolation_preload").split(",")
                    if m.strip())
    explicit = config.getoption("harness_isolation_preload") is not None \
        or config.getini("harness_isolation_preload") != ",".join(DEFAULT_PRELOAD)
    return modules, explicit


def ranks_launch(config: pytest.Config) -> LaunchSpec:
    """Where the collectives' ranks run (``--ranks-*``, else torchrun's ``PET_*``)."""
    get = config.getoption
    try:
        spec = LaunchSpec.from_options(
            get("ranks_launcher"), get("ranks_nnodes"), get("ranks_nproc_per_node"),
            get("ranks_rdzv_endpoint"), get("ranks_node_rank"), get("ranks_store_port"),
            bool(get("ranks_loopback")), ray_address=get("ranks_ray_address"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    workers = getattr(config.option, "numprocesses", None)
    if spec.kind == "torchrun" and spec.rdzv_endpoint and workers:
        raise pytest.UsageError(
            f"--ranks-launcher torchrun with -n {workers}: the nodes serve one job at a time "
            "at one rendezvous endpoint; run the collectives without -n (or with "
            "--ranks-loopback and no endpoint: free ports per job)")
    return spec
