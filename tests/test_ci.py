"""ci/: the runner script end to end, and the workflow files checked by a linter."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.process_checks import assert_gone

ROOT = Path(__file__).parent.parent
WORKFLOWS = sorted((ROOT / "ci" / "workflows").glob("*.yml"))


def _lint(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("check-jsonschema")
    if exe is None:
        pytest.skip("check-jsonschema is not installed (bash ci/setup.sh --test installs it)")
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows",
                           *map(str, paths)], capture_output=True, text=True, check=False)


def test_workflows_pass_the_github_workflow_schema() -> None:
    assert [p.name for p in WORKFLOWS] == ["multinode.yml", "nightly.yml", "pr-cpu.yml"]
    proc = _lint(WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_linter_catches_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOWS[0].read_text().replace("runs-on:", "runs-onn:", 1))
    proc = _lint([broken])
    assert proc.returncode != 0 and "'runs-on' is a required property" in proc.stdout


def test_shell_scripts_parse() -> None:
    for script in ("ci/run-suites.sh", "ci/setup.sh", "ci/lock.sh", "ci/upstream.sh", ".ci/run",
                   "ci/compat.sh", "ci/wheel-smoke.sh", "ci/bisect-night.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / script)], check=False).returncode == 0


def test_run_suites_end_to_end(tmp_path: Path) -> None:
    """A failing extra test that leaves a sleeper behind: the job fails with pytest's status,
    the report is still written, and nothing of the run's process group survives."""
    pidfile = tmp_path / "sleeper.pid"
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess\n"
        "def test_leaves_a_process_and_fails():\n"
        "    p = subprocess.Popen(['sleep', '600'])\n"
        f"    open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "    assert False, 'made to fail'\n")
    out = tmp_path / "out"
    env = dict(os.environ, HARNESS_OUT=str(out), HARNESS_RUNNER="ci-e2e")
    proc = subprocess.run(
        ["bash", str(ROOT / "ci" / "run-suites.sh"), "-k", "leaky or reference-mm-enabled",
         "--bi-target", "reference", str(tmp_path / "test_leaky.py"), "-p", "no:cacheprovider",
         "--rootdir", str(ROOT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "npu-regress: runner=ci-e2e device=cpu x1" in proc.stdout
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    outcomes = {r["id"].rsplit("::", 1)[-1]: r["outcome"] for r in lines if r["type"] == "test"}
    assert outcomes == {"test_leaves_a_process_and_fails": "failed",
                        "test_switch[reference-mm-enabled]": "passed"}
    assert lines[0]["runner"] == "ci-e2e" and lines[-1]["type"] == "footer"
    assert (out / "junit.xml").is_file()
    summary = (out / "report" / "summary.md").read_text()
    assert "test_leaves_a_process_and_fails | ci-e2e | failed" in summary
    assert_gone([int(pidfile.read_text())])


def _pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "ci" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"ci/constraints.txt: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_constraints_pin_every_dependency_within_the_declared_bounds() -> None:
    """The lock holds each dependency of the harness and its tests, at a version that the
    bounds in pyproject.toml allow, and never torch (an existing torch is never replaced)."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _pins()
    for spec in importlib.metadata.requires("npu-regress") or []:  # pyproject's, with extras
        req = Requirement(spec)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                              for e in ("", "test", "upstream")):
            continue  # tomli: Python 3.10 only
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in ci/constraints.txt"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} outside {req}"
    assert not {"torch", "torch-npu", "triton"} & set(pins)
    assert not [n for n in pins if n.startswith("nvidia-")]


def test_lock_excludes_are_honoured_by_the_lock() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _pins()
    for line in (ROOT / "ci" / "lock-excludes.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            assert req.specifier.contains(pins[canonicalize_name(req.name)]), line


def test_setup_refuses_an_unknown_flag() -> None:
    proc = subprocess.run(["bash", str(ROOT / "ci" / "setup.sh"), "--lastest"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert "ci/setup.sh: unknown option '--lastest' (use --test, --latest, --upstream, --engine, --profile NAME)" in \
        proc.stderr


def test_nightly_runs_one_cpu_job_on_the_latest_releases() -> None:
    import yaml

    nightly = yaml.safe_load((ROOT / "ci" / "workflows" / "nightly.yml").read_text())
    targets = json.loads(nightly["env"]["DEFAULT_TARGETS"])
    latest = [t for t in targets if "--latest" in t.get("setup", "")]
    assert [(t["name"], t["image"]) for t in latest] == [("cpu-latest", "")]
    runs = [step.get("run", "") for step in nightly["jobs"]["suites"]["steps"]]
    assert "bash ci/setup.sh ${{ matrix.target.setup }}" in runs
    # the CPU rows bisect their new failures; the report shows what the bisects found
    assert any(r.startswith("bash ci/bisect-night.sh") for r in runs)
    render = next(s["run"] for s in nightly["jobs"]["report"]["steps"]
                  if s.get("name") == "Render")
    assert '"${bisects[@]}"' in render and "runs/*/bisect.json" in render


def test_the_wheel_declares_every_data_file_of_the_package() -> None:
    """Before: the wheel carried the report's templates only, not declared.toml,
    known_findings.toml or pairings.toml (ci/wheel-smoke.sh builds and runs the wheel)."""
    import fnmatch
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    missing = []
    for path in (ROOT / "harness").rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        rel = path.relative_to(ROOT / package.replace(".", "/")).as_posix()
        # a file in a sub-folder belongs to the nearest package that declares globs for it
        owners = {pkg: globs for pkg, globs in declared.items()
                  if package == pkg or package.startswith(pkg + ".")}
        covered = any(fnmatch.fnmatch(path.relative_to(ROOT / pkg.replace(".", "/")).as_posix(),
                                      glob) for pkg, globs in owners.items() for glob in globs)
        if not covered:
            missing.append(f"{package}: {rel}")
    assert missing == []


def test_the_device_script_starts_in_its_dry_mode(tmp_path: Path) -> None:
    """bench/device/cuda_check.sh --dry, as CI can run it (no device): it names each part that
    needs one, runs the rest, and its selections are not empty; so the script is known to
    start before device time is spent on it."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "bench/device/cuda_check.sh", "--dry", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "these parts need one and are not run: isolation on CUDA" in text
    assert "needs a CUDA device" in text  # the isolation file's tests skip, naming why
    assert re.search(r"would run [1-9]\d* cases of suites/test_batch_invariant_switch.py", text)
    assert re.search(r"would run [1-9]\d* cases of suites/test_logprob_batch_invariance.py", text)
    assert (out / "results.jsonl").is_file() and (out / "report").is_dir()
