"""The HTTP serving case's step log (issue 58), without an engine: what it reads, when it
calls a run vacuous, the variables it gives a server, and that the plugin does nothing in a
vLLM that was not started by the case. The real server's rows and the control whose clients
finish before the probe run on the engine (tests/test_vllm_engine.py)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.logprobs.serving import step_log

PROBE = "npu-regress-probe-load"


def _log(tmp_path: Path, *records: dict[str, object]) -> Path:
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"requests": ["cut')
    return path


def test_the_probe_s_own_steps_count_not_the_load_around_them(tmp_path: Path) -> None:
    shared = _log(tmp_path, {"pid": 1, "loaded": True},
                  {"requests": ["cmpl-a-0", "cmpl-b-0"]},
                  {"requests": [f"cmpl-{PROBE}-0-1f2e", "cmpl-a-0", "cmpl-b-0", "cmpl-c-0"]},
                  {"requests": [f"cmpl-{PROBE}-0-1f2e"]})
    log = step_log.StepLog.read(shared)  # the last line, cut by the server's end, is skipped
    assert log.loaded and log.beside(PROBE) == [3, 0]
    assert log.why_vacuous(PROBE, 3) is None
    assert log.why_vacuous(PROBE, 4) == ("vacuous: the probe's 2 engine steps held at most 3 "
                                         "other request(s) (needs 4)")


def test_a_load_that_left_before_the_probe_is_vacuous(tmp_path: Path) -> None:
    """Steps full of other requests, then the probe's steps alone: the gauge would have read
    high around the probe; the steps say it ran alone."""
    path = _log(tmp_path, {"pid": 1, "loaded": True},
                *[{"requests": [f"cmpl-{i}-0" for i in range(12)]} for _ in range(5)],
                *[{"requests": [f"cmpl-{PROBE}-0"]} for _ in range(16)])
    why = step_log.StepLog.read(path).why_vacuous(PROBE, 3)
    assert why == ("vacuous: the probe's 16 engine steps held at most 0 other request(s) "
                   "(needs 3)")


def test_a_log_that_did_not_load_or_never_saw_the_probe_is_vacuous(tmp_path: Path) -> None:
    missing = step_log.StepLog.read(tmp_path / "none.jsonl")
    assert "did not load" in (missing.why_vacuous(PROBE, 3) or "")
    unseen = step_log.StepLog.read(_log(tmp_path, {"pid": 1, "loaded": True},
                                        {"requests": ["cmpl-a-0"]}))
    assert unseen.why_vacuous(PROBE, 3) == ("vacuous: no engine step scheduled the probe (its "
                                            "request id was not seen)")
    refused = step_log.StepLog.read(_log(tmp_path, {"pid": 1, "unsupported": "no v1 "
                                                    "scheduler: gone"}))
    assert refused.why_vacuous(PROBE, 3) == ("vacuous: the step log could not wrap the "
                                             "scheduler: no v1 scheduler: gone")


def test_the_server_env_keeps_a_user_s_plugin_allowlist(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    assert step_log.server_env(path, {}) == {step_log.ENV: str(path)}
    assert step_log.server_env(path, {"VLLM_PLUGINS": "lora_filesystem_resolver"}) == {
        step_log.ENV: str(path),
        "VLLM_PLUGINS": f"lora_filesystem_resolver,{step_log.PLUGIN}"}
    assert step_log.server_env(path, {"VLLM_PLUGINS": ""})["VLLM_PLUGINS"] == step_log.PLUGIN


def test_the_plugin_is_inert_without_its_variable(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(step_log.ENV, raising=False)
    step_log.register()  # vLLM calls it in every process: no vLLM import, nothing written
    assert list(tmp_path.iterdir()) == []


def test_the_entry_point_names_the_plugin() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {step_log.PLUGIN: "npu_regress_step_log:register"}


def test_the_plugin_module_imports_nothing_of_the_harness() -> None:
    """Read from its source (every import, lazy ones too): the standard library and vLLM's
    scheduler only."""
    import ast

    import npu_regress_step_log

    tree = ast.parse(Path(npu_regress_step_log.__file__).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert names == {"__future__", "json", "os", "threading", "time", "typing",
                     "vllm.v1.core.sched.scheduler"}, names


VLLM_PROCESS = """
import json, os, sys
from vllm.plugins import load_general_plugins
load_general_plugins()  # what vLLM runs at the start of each of its processes
print("MODULES " + json.dumps({
    "harness": sorted(m for m in sys.modules if m == "harness" or m.startswith("harness.")),
    "plugin": "npu_regress_step_log" in sys.modules}))
"""


def test_a_vllm_process_without_the_variable_imports_nothing_of_the_harness(tmp_path: Path) -> None:
    """Issue 69: the engine venv's vLLM loads every general plugin in every process. Without
    the variable ours is loaded (shown: its module is there) and no ``harness`` module is; with
    it, the plugin wraps the scheduler (its first line says so), still without the harness."""
    import os
    import subprocess

    from tests.test_vllm_engine import _engine_python

    python = _engine_python()
    env = {k: v for k, v in os.environ.items()
           if k not in (step_log.ENV, "VLLM_PLUGINS") and not k.startswith("PYTEST_")}
    log = tmp_path / "steps.jsonl"
    found = {}
    for name, extra in (("without", {}), ("with", {step_log.ENV: str(log)})):
        proc = subprocess.run([str(python), "-c", VLLM_PROCESS], env={**env, **extra},
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              check=False)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("MODULES ")), None)
        assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
        found[name] = json.loads(line.removeprefix("MODULES "))
    assert found["without"] == {"harness": [], "plugin": True}, found
    assert found["with"] == {"harness": [], "plugin": True}, found
    assert step_log.StepLog.read(log).loaded  # the control: with the variable, it acted


def test_a_prompt_comparison_with_no_position_in_common_is_vacuous() -> None:
    """Issue 58: a comparison with nothing to compare fails as vacuous, never equal."""
    import torch

    from harness.logprobs.serving.comparison import ServingReport

    report = ServingReport("prefix-cache", "vllm")
    report.compare_prompt("after the prefix's request vs first", torch.zeros(0),
                          torch.zeros(5))
    assert report.equal and report.vacuous == (
        "vacuous: after the prefix's request vs first: no prompt position to compare (the two "
        "runs returned 0 and 5 prompt logprobs)")
    both = ServingReport("prefix-cache", "vllm")
    both.compare_prompt("x", torch.zeros(3), torch.zeros(5))
    assert not both.vacuous and both.prompt_positions == 3
