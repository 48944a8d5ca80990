"""The concurrent case through vLLM's OpenAI-compatible server, with concurrent HTTP
clients: the way vllm-ascend #12610 was found (``hey -c 32`` against ``vllm serve``).

The isolated child starts the server (``python -m vllm.entrypoints.openai.api_server``,
the seeded model, the switch as users set it: ``VLLM_BATCH_INVARIANT`` in the server's
environment) and sends the probe (``/v1/completions``, prompt token ids, 16 greedy tokens,
``logprobs=0``) alone; then ``CLIENTS`` clients send mixed requests in a loop (prompts of 8
to 100 tokens, ``max_tokens`` 4 to 20, half sampled with a seed) and the probe again while
they run. The probe's tokens and logprobs must be the same bits (JSON floats round-trip a
float32 exactly).

No vacuous pass: the server logs which requests each engine step scheduled (``step_log``,
a vLLM general plugin of ours, loaded in the engine core), and the probe's own steps must
hold ``MIN_RUNNING - 1`` other requests; a server whose log did not load, or where the probe
ran alone, is vacuous. The ``/metrics`` gauge (``vllm:num_requests_running``) is still
sampled and recorded, but it shows load near the probe, not with it: a control whose
clients finish before the probe is sent keeps the gauge's high samples and is vacuous. The
dispatch recorder cannot look inside the server process: a difference here is reported
without a first divergent op (the in-process ``concurrent`` case names it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from harness.isolation.reaper import end_tree
from harness.logprobs.serving import step_log
from harness.logprobs.serving.comparison import ServingReport
from harness.logprobs.serving.loop import Served
from harness.logprobs.serving.workload import PROBE_STEPS, load, probe_prompt
from harness.stack.network import free_port

CLIENTS = 12
#: running requests the gauge must show while the probe is in flight (the probe and 3)
MIN_RUNNING = 4
#: seconds the server may take to answer /health
START_TIMEOUT = 300


def _post(url: str, body: dict[str, Any], timeout: float = 120,
          request_id: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if request_id:  # vLLM takes it as the request's id: the step log then names it
        headers["X-Request-Id"] = request_id
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - localhost
        return json.loads(resp.read())


def _running(base: str) -> float:
    """The server's ``vllm:num_requests_running`` gauge (summed over engines), or -1."""
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
    except OSError:
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


class Server:
    """``vllm serve`` on the seeded model, on a free local port; stopped on exit."""

    def __init__(self, model: Path, dtype: str, enabled: bool, log: Path,
                 steps: Path) -> None:
        from harness.logprobs import vllm_source
        from harness.stack import devices

        self.port = free_port("127.0.0.1")
        self.base = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        env = {**os.environ, **vllm_source.CPU_ENV} if devices.device_kind() == "cpu" \
            else dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's own default
        env["VLLM_BATCH_INVARIANT"] = "1" if enabled else "0"
        env.update(step_log.server_env(steps, env))
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
             self.model, "--dtype", dtype, "--port", str(self.port), "--host", "127.0.0.1",
             "--max-model-len", "512", "--seed", "0"],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} before it "
                                   f"answered; {self.cause()}")
            try:
                with urllib.request.urlopen(f"{self.base}/health", timeout=2):  # noqa: S310
                    return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"vllm serve did not answer /health in {START_TIMEOUT} s; "
                           f"{self.cause()}")

    def __exit__(self, *_: Any) -> None:
        """The server and its engine processes (the isolation core's reaper), then reaped."""
        if self.proc.poll() is None:
            end_tree(self.proc.pid, grace=30.0)
        self.proc.wait()

    def cause(self) -> str:
        """One line: the server log's root cause (the first exception a process logged,
        not a warning and not a wrapper that points "above"), and where the log is. One
        line, so that a known finding's text matches it as it matches an engine's own."""
        text = self.log.read_text(errors="replace")
        for line in text.splitlines():
            found = re.search(r"\b[A-Z]\w*(Error|Exception): .*", line)
            if found and " WARNING " not in line and not any(
                    w in line for w in ("Worker failed with error", "initialization failed",
                                        "EngineDeadError", "See stack trace")):
                return f"root cause in its log ({self.log}): {found.group(0)}"
        last = " | ".join(text.strip().splitlines()[-3:])
        return f"no exception in its log ({self.log}), which ends: {last}"

    def complete(self, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return _post(f"{self.base}/v1/completions",
                     {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                      **extra})


#: the probe's request ids hold this, then what it was sent for
PROBE_ID = "npu-regress-probe"


def _probe(server: Server, probe: list[int], label: str) -> Served:
    out = _post(f"{server.base}/v1/completions",
                {"model": server.model, "prompt": probe, "max_tokens": PROBE_STEPS,
                 "min_tokens": PROBE_STEPS, "temperature": 0.0, "logprobs": 0,
                 "ignore_eos": True, "return_tokens_as_token_ids": True},
                request_id=f"{PROBE_ID}-{label}")
    logprobs = out["choices"][0]["logprobs"]
    tokens = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    return Served(tokens, torch.tensor(logprobs["token_logprobs"], dtype=torch.float32))


def run_http_case(enabled: bool, dtype: str, knobs: dict[str, Any] | None = None
                  ) -> ServingReport:
    """Child side: the probe alone, then under ``CLIENTS`` concurrent clients (``knobs``:
    ``clients``, 0 the negative control; ``finish_first``: the clients stop, and are
    waited for, before the probe is sent: the gauge's samples stay high, its steps alone)."""
    return run_http_cases(enabled, dtype, [knobs or {}])[0]


def run_http_cases(enabled: bool, dtype: str, cases: list[dict[str, Any]]
                   ) -> list[ServingReport]:
    """Child side: ``run_http_case`` for each of ``cases`` (its ``knobs``), one after another
    against one ``vllm serve`` (a start is about 30 s of a 2-core runner's CPU: the API
    server, the engine core and its worker each import vLLM). For controls whose condition
    is judged: the server has served the cases before, so its prefix cache holds their
    prompts. Each case's probe has request ids of its own, and its steps are read apart."""
    import tempfile

    from harness.logprobs import seeded_model

    model = seeded_model.build()
    config = json.loads((model / "config.json").read_text())
    vocab = int(config["vocab_size"])
    probe, _ = probe_prompt(vocab)
    others = load(vocab)
    folder = Path(tempfile.mkdtemp(prefix="npu-regress-serve-"))
    log, steps = folder / "server.log", folder / "steps.jsonl"
    runs: list[dict[str, Any]] = []
    with Server(model, dtype, enabled, log, steps) as server:
        for n, knobs in enumerate(cases):
            # one case keeps the ids it always had ("...-load"); several, one prefix each
            prefix = f"{n}-" if len(cases) > 1 else ""
            runs.append(_probe_under_load(server, probe, others, dict(knobs), prefix))
    scheduled = step_log.StepLog.read(steps)
    return [_report(run, dtype, scheduled) for run in runs]


def _probe_under_load(server: Server, probe: list[int], others: list[Any],
                      knobs: dict[str, Any], prefix: str) -> dict[str, Any]:
    """One case on a running server: the probe alone, under the clients, alone again."""
    clients = int(knobs.get("clients", CLIENTS))
    finish_first = bool(knobs.get("finish_first"))
    try:
        ref = _probe(server, probe, prefix + "alone")
    except OSError as exc:  # the server's own failure: its log says why
        raise RuntimeError(f"the probe request failed ({exc}); "
                           f"{server.cause()}") from None
    stop = threading.Event()
    errors: list[str] = []

    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            a = others[i % len(others)]
            try:
                server.complete(list(a.prompt), a.max_tokens, temperature=a.temperature,
                                seed=a.seed, logprobs=a.logprobs, ignore_eos=True)
            except OSError as exc:  # the server's failure is the case's, said below
                errors.append(f"{type(exc).__name__}: {exc}")
                return
            i += clients

    threads = [threading.Thread(target=client, args=(k,), daemon=True)
               for k in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while clients and _running(server.base) < MIN_RUNNING - 1 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    seen: list[float] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(_running(server.base))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if finish_first:  # the control: the load gone before the probe is sent
        stop.set()
        for t in threads:
            t.join(120)
    got = _probe(server, probe, prefix + "load")
    done.set()
    watcher.join()
    stop.set()
    for t in threads:
        t.join(120)
    alone_again = _probe(server, probe, prefix + "after")
    return {"clients": clients, "ref": ref, "got": got, "after": alone_again, "seen": seen,
            "errors": errors, "marker": f"{PROBE_ID}-{prefix}load"}


def _report(run: dict[str, Any], dtype: str, scheduled: step_log.StepLog) -> ServingReport:
    """One case's report: its comparisons, and its condition from the server's step log."""
    clients = run["clients"]
    report = ServingReport("concurrent-http", f"vllm serve ({dtype}, seeded 4-layer llama, "
                                              f"{clients} HTTP clients)")
    report.compare("under concurrent HTTP clients", run["ref"], run["got"])
    report.compare("alone again, after the load", run["ref"], run["after"])
    seen, errors, marker = run["seen"], run["errors"], run["marker"]
    beside = scheduled.beside(marker)
    report.condition.update({"clients": clients, "max_running_seen": max(seen, default=0.0),
                             "gauge_samples": len(seen), "client_errors": len(errors),
                             "step_log_loaded": scheduled.loaded,
                             "probe_steps": len(beside),
                             "probe_max_beside": max(beside, default=0),
                             "probe_steps_shared": sum(1 for b in beside if b > 0)})
    if errors:
        raise RuntimeError(f"{len(errors)} client request(s) failed, first: {errors[0]}")
    report.vacuous = scheduled.why_vacuous(marker, MIN_RUNNING - 1)
    if report.mismatches:
        report.first_divergence = ("not located: the engine runs in the server's process, "
                                   "where the dispatch recorder cannot look (the "
                                   "in-process concurrent case names the op)")
    return report
