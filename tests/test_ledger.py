"""The ledger of known release findings and the cause-before-verdict filing
(harness.plugin.verdicts): a known finding is a strict expected failure on an affected
release, "fixed upstream" when the upstream code is fixed (a patched copy of vllm-ascend's
function, run through the real switch case), and a failure that is not the ledger's stays
a failure; our own causes are never filed as release findings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.isolation.failure_text import failure_lines
from harness.plugin import verdicts
from harness.stack.upstream import PROFILE_RECORD_ENV, package_dirs
from tests.inner_runs import inner_environ

ROOT = Path(__file__).resolve().parent.parent
TENSOR_SUM = ("suites/test_batch_invariant_switch.py::"
              "test_switch[vllm_ascend-tensor_sum-enabled]")

pytest_plugins = ["pytester"]


def test_the_built_in_ledger_lists_the_tensor_sum_finding() -> None:
    finding = {f.id: f for f in verdicts.load_ledger()}["vllm-ascend-tensor-sum-dim"]
    assert finding.id == "vllm-ascend-tensor-sum-dim"
    assert TENSOR_SUM in finding.cases and "PR #14949" in finding.fix
    assert finding.applies("0.23.0.post1") and finding.applies("0.23.0")
    assert not finding.applies("0.24.0rc1") and not finding.applies(None)


def test_a_bad_ledger_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "ledger.toml"
    bad.write_text('[[finding]]\nid = "x"\n')
    with pytest.raises(verdicts.LedgerError, match="finding #1 lacks title"):
        verdicts.load_ledger(bad)


def _ledger(tmp_path: Path, nodeid: str, dist: str = "pytest",
            match: str | list[str] = "the known symptom") -> Path:
    path = tmp_path / "ledger.toml"
    path.write_text(textwrap.dedent(f"""\
        [[finding]]
        id = "demo"
        title = "a demo finding"
        distribution = "{dist}"
        affected = ">=1"
        cases = ["{nodeid}"]
        match = {json.dumps(match)}
        evidence = "seen in a demo"
        fix = "demo PR #1"
        """))
    return path


@pytest.mark.parametrize(("body", "outcome", "category"), [
    ("assert False, 'the known symptom'", "xfailed", "known-finding"),
    ("pass", "failed", "fixed-upstream"),
    ("assert False, 'something else entirely'", "failed", None),
])
def test_a_ledger_case(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       body: str, outcome: str, category: str | None) -> None:
    pytester.makepyfile(test_demo=f"def test_it():\n    {body}\n")
    monkeypatch.setenv(verdicts.LEDGER_ENV, str(_ledger(tmp_path, "test_demo.py::test_it")))
    results = tmp_path / "r.jsonl"
    run = pytester.runpytest_subprocess(f"--harness-results={results}", "-rxf")
    (record,) = [r for r in map(json.loads, results.read_text().splitlines())
                 if r["type"] == "test"]
    assert record["outcome"] == outcome, run.stdout.str()
    assert record["category"] == category
    out = run.stdout.str()
    if category == "known-finding":
        assert "known release finding demo" in out and run.ret == 0
    elif category == "fixed-upstream":
        assert "fixed upstream: demo" in out and "remove it from the ledger" in out
    else:
        assert "this failure is something else" in out and run.ret == 1


@pytest.mark.parametrize(("text", "category"), [
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
     "ModuleNotFoundError: No module named 'vllm_ascend._build_info'", "harness"),
    ("ModuleNotFoundError: No module named 'uvloop'", "harness"),
    (f"Traceback (most recent call last):\n  File \"{verdicts.STANDIN_FILE}\", line 9, in f\n"
     "RuntimeError: PyTorch is not linked with support for npu devices", "stand-in-limit"),
    ("harness.invariance.standin.NotStoodIn: torch_npu.npu_x is native", "stand-in-limit"),
    (f"Traceback (most recent call last):\n  File \"{verdicts.HARNESS_DIR / 'x.py'}\", "
     "line 3, in g\nTypeError: 'NoneType' object is not subscriptable", "harness"),
    (f"Traceback (most recent call last):\n  File \"{verdicts.HARNESS_DIR / 'x.py'}\", "
     "line 3, in g\nAssertionError: expected mm to run", None),
    ("Traceback (most recent call last):\n  File \"/site/vllm/x.py\", line 3, in g\n"
     "RuntimeError: Cannot set preferred backend to cuBLASLt", None),
    ("ModuleNotFoundError: No module named 'nothing_declares_me'", None),
])
def test_the_cause_of_a_failure(text: str, category: str | None) -> None:
    found = verdicts.cause(text, {"uvloop"})
    assert (found[0] if found else None) == category


def _switch_case(tmp_path: Path, sources: Path | None, case: str = TENSOR_SUM
                 ) -> dict[str, object]:
    results = tmp_path / "results.jsonl"
    env = inner_environ()
    if sources is not None:
        env["PYTHONPATH"] = str(sources) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", case, "-p", "no:cacheprovider", "-q",
         "--device", "cpu", f"--harness-results={results}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    (record,) = [r for r in records if r["type"] == "test"]
    record["stdout"] = proc.stdout
    return record


@pytest.fixture(scope="module")
def released_sources() -> Path:
    dirs = package_dirs("vllm_ascend")
    if not dirs or not (dirs[0] / "batch_invariant.py").is_file():
        pytest.skip("vllm-ascend's sources are not installed (bash ci/setup.sh --upstream)")
    return dirs[0]


def test_the_released_code_is_a_known_finding(tmp_path: Path, released_sources: Path) -> None:
    record = _switch_case(tmp_path, None)
    assert record["outcome"] == "xfailed", record["stdout"][-3000:]
    assert record["category"] == "known-finding"
    assert "known release finding vllm-ascend-tensor-sum-dim" in str(record["reason"])


def test_a_fixed_copy_of_the_function_reads_fixed_upstream(tmp_path: Path,
                                                            released_sources: Path) -> None:
    """vllm-ascend 0.23.0.post1 with PR #14949's change (Tensor.sum follows reduce_sum) in a
    copy of its sources: the ledger case passes, and says so."""
    copy = tmp_path / "src"
    shutil.copytree(released_sources, copy / "vllm_ascend")
    module = copy / "vllm_ascend" / "batch_invariant.py"
    text = module.read_text()
    assert "        torch.sum = reduce_sum\n" in text
    module.write_text(text.replace("        torch.sum = reduce_sum\n",
                                   "        torch.sum = reduce_sum\n"
                                   "        torch.Tensor.sum = reduce_sum\n", 1))
    record = _switch_case(tmp_path, copy)
    assert record["outcome"] == "failed", record["stdout"][-3000:]
    assert record["category"] == "fixed-upstream"
    assert "fixed upstream: vllm-ascend-tensor-sum-dim" in str(record["longrepr"])


SUM_FORMS = "suites/test_batch_invariant_switch.py::test_switch_call_forms[vllm_ascend-sum]"


def test_a_new_failure_in_a_ledger_case_is_not_the_known_finding(
        tmp_path: Path, released_sources: Path) -> None:
    """Issue 46's seed: vllm-ascend 0.23.0.post1's reduce_sum with keepdim dropped on the NPU
    path, in a copy of its sources. The case still shows the known finding (dim=0, a dim
    tuple, dtype=) and now one line more: it fails, naming that line."""
    copy = tmp_path / "src"
    shutil.copytree(released_sources, copy / "vllm_ascend")
    module = copy / "vllm_ascend" / "batch_invariant.py"
    text = module.read_text()
    call = "npu_reduce_sum_batch_invariant(x, dim, keepdim)"
    assert call in text
    module.write_text(text.replace(call, "npu_reduce_sum_batch_invariant(x, dim, False)", 1))
    record = _switch_case(tmp_path, copy, SUM_FORMS)
    out = str(record["stdout"])
    assert record["outcome"] == "failed", out[-3000:]
    assert record["category"] != "known-finding"
    new = out.split("NEW FAILURE beside the known finding vllm-ascend-torch-sum-forms", 1)
    assert len(new) == 2, out[-3000:]
    assert "keepdim=True" in new[1].split("\n", 1)[0], new[1][:2000]


FINDING_TEST = '''
def test_it(record_property):
    record_property("release_finding", "vllm 9.9")
    assert False, "the release did this"
'''


def test_a_forward_profile_files_findings_as_forward_compatibility(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.stack import profile

    record = tmp_path / "profile.json"
    record.write_text(json.dumps(profile.load("forward").to_dict()))
    monkeypatch.setenv(PROFILE_RECORD_ENV, str(record))
    pytester.makepyfile(test_f=FINDING_TEST)
    results = tmp_path / "r.jsonl"
    run = pytester.runpytest_subprocess(f"--harness-results={results}")
    (rec,) = [r for r in map(json.loads, results.read_text().splitlines()) if r["type"] == "test"]
    assert rec["category"] == "forward-compat", run.stdout.str()
    run.stdout.fnmatch_lines(["*stack profile forward (forward)*",
                              "*failures are forward-compatibility*"])


def test_a_failure_on_an_unsupported_stack_is_not_a_release_finding(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeconftest('''
from harness.stack import pairing

def pytest_configure(config):
    mixed = {"vllm-ascend": "0.23.0.post1", "vllm": "0.33.0"}
    pairing.for_this_runner = lambda: pairing.check(mixed.get, requires=False)
''')
    pytester.makepyfile(test_u=FINDING_TEST)
    results = tmp_path / "r.jsonl"
    run = pytester.runpytest_subprocess(f"--harness-results={results}")
    records = [json.loads(line) for line in results.read_text().splitlines()]
    (rec,) = [r for r in records if r["type"] == "test"]
    assert rec["category"] == "unsupported-stack", run.stdout.str()
    assert "vllm-ascend 0.23.0.post1 pairs with vllm 0.23.0" in rec["verdict"]["reason"]
    (header,) = [r for r in records if r["type"] == "header"]
    assert header["stack"]["pairing"]["supported"] is False
    run.stdout.fnmatch_lines(["*UNSUPPORTED STACK: vllm-ascend 0.23.0.post1 pairs with vllm*"])


def test_a_finding_can_need_a_partner_release() -> None:
    """verl 0.9.1's exact-source refusal shows on vLLM 0.23.x only: on 0.24.0 the patch finds
    the fix upstream and compares nothing, so the ledger must not call that 'fixed'."""
    finding = {f.id: f for f in verdicts.load_ledger()}["verl-glm52-dummy-batch-exact-source"]
    assert finding.applies("0.9.1", {"vllm": "0.23.0"}.get)
    assert not finding.applies("0.9.1", {"vllm": "0.24.0"}.get)
    assert "vllm <0.24" in finding.reason("0.9.1")


KNOWN_LINES = ["`sum(x, 0)` raised EZ1001", "`sum(x, dtype=f32)` raised TypeError"]


@pytest.mark.parametrize(("problems", "outcome", "shown"), [
    (["`sum(x, 0)` raised EZ1001: last dim only", "`sum(x, dtype=f32)` raised TypeError: no"],
     "xfailed", "known release finding demo"),
    # partly fixed: the finding is still there, and the reason says which line is gone
    (["`sum(x, 0)` raised EZ1001: last dim only"], "xfailed", "partly fixed: no line shows"),
    # the seeded regression of issue 46: keepdim dropped, beside the known finding
    (["`sum(x, 0)` raised EZ1001: last dim only", "`sum(x, dtype=f32)` raised TypeError: no",
      "`sum(x, -1, keepdim=True)` returns shape (4,) where off returns (4, 1)"],
     "failed", "NEW FAILURE beside the known finding demo"),
])
def test_a_ledger_entry_never_hides_a_new_failure_line(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        problems: list[str], outcome: str, shown: str) -> None:
    """Before: an entry matched its text anywhere in the failure, so a new problem in a
    ledger case (vllm-ascend's reduce_sum with keepdim dropped) stayed a known finding."""
    pytester.makepyfile(test_demo=f"""
        def test_it():
            problems = {problems!r}
            assert not problems, "\\n- ".join(["sum with the switch on:", *problems])
        """)
    monkeypatch.setenv(verdicts.LEDGER_ENV,
                       str(_ledger(tmp_path, "test_demo.py::test_it", match=KNOWN_LINES)))
    results = tmp_path / "r.jsonl"
    run = pytester.runpytest_subprocess(f"--harness-results={results}", "-rxf")
    (record,) = [r for r in map(json.loads, results.read_text().splitlines())
                 if r["type"] == "test"]
    out = run.stdout.str()
    assert record["outcome"] == outcome, out
    assert shown in out, out
    if outcome == "failed":
        assert "keepdim=True" in out.split("NEW FAILURE", 1)[1], out
        assert "still there" in out and record["category"] != "known-finding"


def test_the_failure_lines_of_an_isolated_childs_exception() -> None:
    """The child's traceback note is no failure line; a note that the child crashed after
    its result is one (a known finding must not hide it)."""
    exc = TypeError("'function' object is not subscriptable")
    exc.__notes__ = ["--- traceback in isolated child (pid 7) ---\nTraceback (most recent "
                     "call last):\n  File \"x.py\", line 1\nTypeError: 'function' object",
                     "then the child was killed by SIGSEGV during exit"]
    lines = failure_lines(None, SimpleNamespace(value=exc))
    assert lines == ["TypeError: 'function' object is not subscriptable",
                     "then the child was killed by SIGSEGV during exit"]
    text = ("E   AssertionError: header:\nE     - one\nE     events counted: {}\n"
            "E   assert not ['one']\n")
    assert failure_lines(text) == ["one"]


def test_the_built_in_ledger_covers_each_line_of_its_cases() -> None:
    """Each built-in entry with several texts names distinct lines (no text inside another,
    which would let one line stand for two)."""
    for finding in verdicts.load_ledger(verdicts.LEDGER):
        for a in finding.match:
            assert not any(a != b and a in b for b in finding.match), (finding.id, a)
