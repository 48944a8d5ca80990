"""``npu-regress bisect`` on a local index of constructed wheels (a toy package, five
releases, each a real wheel that pip installs; every trial a real ``pytest`` run): what "the
same failure" means, one bisect per distinct failure, flaky probes and references, and the
faults that must end as skips.

- ``test_one`` passes on 1.0, fails on 2.0 and 3.0 with failure A ("the decode rows differ",
  "first divergent op: none found") and from 4.0 with failure B ("the prefill rows differ",
  the same last line). ``test_two`` fails from 2.0 with failure C.
- Tonight (5.0) has two new failures with two signatures: two bisects, two cards. B's names
  4.0, not 2.0 (3.0 "fails another way"); C's names 2.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.bisect.command import main
from harness.bisect.overlay import Overlays

VERSIONS = ("1.0", "2.0", "3.0", "4.0", "5.0")

TESTS = '''\
import os

import pytest
import toypkg


def _fail(problems):
    if problems:
        pytest.fail("rows differ:\\n" + "\\n".join(f"- {p}" for p in problems), pytrace=False)


def test_one():
    if toypkg.NEEDS_GPU and os.environ.get("TOY_NO_GPU"):
        pytest.skip("needs a GPU")
    _fail(toypkg.problems_one())


def test_two():
    _fail(toypkg.problems_two())


def test_line():
    if toypkg.line():
        pytest.fail(toypkg.line(), pytrace=False)
'''

#: ``test_one``'s problems by mode and release: "decade" is issue 68's case (a bug from 2.0
#: whose figure crosses a decade at 4.0, as a bullet list and, in ``test_line``, as a one-line
#: message; 3.0's wheel does not compile); "coin" a release (3.0) that ends as tonight in
#: half of its runs, from a seeded coin
_DECADE = "['mismatch in {} of 64 values', 'first divergent op: matmul']"


def _source(n: int, mode: str) -> str:
    """toypkg's ``__init__.py`` at release ``n``."""
    line = "None"
    two = "[]" if n == 1 else "['max_ulp 42161 over its bound 300']"
    if mode == "flaky":  # 1.0 passes, 2.0-4.0 fail every other run, 5.0 always
        one = ("[] " if n == 1 else "['the decode rows differ'] if n == 5 or _tick() else [] ")
        two = "[]"
    elif mode == "decade":
        one = "[]" if n == 1 else _DECADE.format(8 if n < 4 else 12)
        line = "None" if n == 1 else repr(f"mismatch in {8 if n < 4 else 12} of 64 values")
        two = "[]"
    elif mode == "coin":
        one = ("[]" if n < 3 else "['the decode rows differ']" if n > 3 else
               "['the decode rows differ'] if _coin() else []")
        two = "[]"
    else:
        one = ("[]" if n == 1 else
               "['the decode rows differ', 'first divergent op: none found']"
               if n < 4 else "['the prefill rows differ', 'first divergent op: none found']")
    broken = "def broken(:\n    pass\n\n\n" if mode == "decade" and n == 3 else ""
    return (f"import os\nimport random\nn = {n}\nNEEDS_GPU = {n == 1}\n\n\n{broken}"
            "def _tick():\n"
            "    path = os.environ['TOY_COUNTER']\n"
            "    count = int(open(path).read() or 0) if os.path.exists(path) else 0\n"
            "    open(path, 'w').write(str(count + 1))\n"
            "    return count % 2 == 0\n\n\n"
            "def _coin():  # seeded: the test that runs it is deterministic\n"
            "    path = os.environ['TOY_COUNTER']\n"
            "    count = int(open(path).read() or 0) if os.path.exists(path) else 0\n"
            "    open(path, 'w').write(str(count + 1))\n"
            "    return random.Random(f\"{os.environ['TOY_SEED']}-{count}\").random() < 0.5\n\n\n"
            f"def problems_one():\n    return {one}\n\n\n"
            f"def problems_two():\n    return {two}\n\n\n"
            f"def line():\n    return {line}\n")


def _wheel(folder: Path, version: str, source: str) -> None:
    """A real wheel of toypkg (pure Python, no hashes in its RECORD)."""
    info = f"toypkg-{version}.dist-info"
    files = {"toypkg/__init__.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: toypkg\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: npu-regress-tests\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"toypkg-{version}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


def _night(base: Path, name: str, overlays: Overlays, version: str, env: dict[str, str]
           ) -> Path:
    """A night: the toy suite run with toypkg ``version`` overlaid, its manifest naming it."""
    path = base / f"{name}.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", "test_toy.py", "-q", "-p",
                    "no:cacheprovider", f"--harness-results={path}"], cwd=base / "suite",
                   env={**env, "PYTHONPATH": str(overlays.get("toypkg", version))},
                   capture_output=True, check=False)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["manifest"]["toypkg"] = {"version": version}
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return path


def _toy(base: Path, mode: str) -> dict[str, Path]:
    (base / "index").mkdir(parents=True)
    (base / "suite").mkdir()
    (base / "suite" / "test_toy.py").write_text(TESTS)
    for n, version in enumerate(VERSIONS, 1):
        _wheel(base / "index", version, _source(n, mode))
    overlays = Overlays(base / "night-overlays", ("--no-index", f"--find-links={base / 'index'}"))
    env = {**os.environ, "TOY_COUNTER": str(base / "counter"), "TOY_SEED": "0"}
    return {"base": base, "good": _night(base, "good", overlays, "1.0", env),
            "bad": _night(base, "bad", overlays, "5.0", env)}


def _bisect(toy: dict[str, Path], state: str, *extra: str) -> tuple[int, dict]:
    base = toy["base"]
    status = main([str(toy["good"]), str(toy["bad"]), "--rootdir", str(base / "suite"),
                   "--pip-option=--no-index", f"--pip-option=--find-links={base / 'index'}",
                   "--state", str(base / state), *extra])
    return status, json.loads((base / state / "bisect.json").read_text())


def test_two_failures_two_bisects_each_to_its_own_release(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    toy = _toy(tmp_path, "plain")
    monkeypatch.setenv("TOY_COUNTER", str(tmp_path / "counter"))
    status, outcome = _bisect(toy, "state")
    assert status == 0, outcome["why"]
    one, two = sorted(outcome["groups"], key=lambda g: g["tests"])
    assert one["tests"] == ["test_toy.py::test_one"] and two["tests"] == ["test_toy.py::test_two"]
    # B (the prefill rows) came with 4.0; 2.0 brought A, which shares B's last line: 2.0
    # and 3.0 fail another way, said as such and never called good
    assert one["first_bad"] == {"package": "toypkg", "version": "4.0"}, one["why"]
    assert one["last_good"] == {"package": "toypkg", "version": "3.0"}
    assert one["other_since"] == "2.0" and one["search"]["last_good"] == "1.0"
    assert "the decode rows differ" in one["last_good_other"]
    assert one["card"].startswith(
        "first bad for tonight's failure: toypkg 4.0 (ends as tonight in 5 of 5 runs); 3.0 "
        "fails another way in 5 of 5 runs; the releases before it fail another way since "
        "2.0: "), one["card"]
    assert one["search"]["tried"].get("3.0") == "other"
    # C, the other test's failure, is its own bisect: 2.0
    assert two["first_bad"] == {"package": "toypkg", "version": "2.0"}, two["why"]
    assert two["card"].startswith("first bad for tonight's failure: toypkg 2.0 (ends as "
                                  "tonight in 5 of 5 runs); 1.0 good in 5 of 5 runs"), two["card"]
    # each probe ran twice and its runs agreed; the boundary's five times
    for group in (one, two):
        assert all(len(t["runs"]) == (5 if t["role"].endswith("(confirm)") else 2)
                   and len(set(t["runs"])) == 1 for t in group["trials"]), group["trials"]
    assert outcome["card"].startswith("2 distinct failures, one bisect each: ")

    # the report puts each group's card on its own test
    from harness.report.bisect_outcomes import _cards

    assert dict((tuple(t), c) for c, t in _cards(outcome)) == {
        ("test_toy.py::test_one",): one["card"], ("test_toy.py::test_two",): two["card"]}


def test_a_flaky_probe_is_said_with_its_rate_and_nothing_is_blamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toy = _toy(tmp_path, "flaky")
    monkeypatch.setenv("TOY_COUNTER", str(tmp_path / "counter"))
    status, outcome = _bisect(toy, "state", "--test", "test_toy.py::test_one")
    assert status == 2, outcome
    [group] = outcome["groups"]
    assert group["status"] == "not-found" and "first_bad" not in group
    assert group["flaky"] and all("ended as tonight in 1 of 2 runs" in f
                                  for f in group["flaky"]), group["flaky"]
    assert set(group["search"]["tried"].values()) == {"flaky"}, group["search"]
    assert "could not be judged" in group["why"] and "flaky" in group["card"]

    # a good night whose rerun skips is no reference: the bisect stops and says so
    monkeypatch.setenv("TOY_NO_GPU", "1")
    status, outcome = _bisect(toy, "state-skip", "--test", "test_toy.py::test_one")
    assert status == 2
    why = outcome["groups"][0]["why"]
    assert why.startswith("the good night's results do not reproduce here"), why
    assert "skipped on rerun: a test that does not run is no reference" in why


def test_one_bug_whose_figure_crosses_a_decade_is_one_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 68: 2.0 brings a bug that reads "mismatch in 8 of 64 values" (then "first
    divergent op: matmul"); from 4.0 the same bug reads "12 of 64". As a bullet list
    (test_one) and as a one-line message (test_line) both bisects name 2.0, exit 0. 3.0's
    wheel raises SyntaxError: a skip named by its error, never pytest's summary."""
    toy = _toy(tmp_path, "decade")
    monkeypatch.setenv("TOY_COUNTER", str(tmp_path / "counter"))
    status, outcome = _bisect(toy, "state")
    groups = {tuple(g["tests"]): g for g in outcome["groups"]}
    assert set(groups) == {("test_toy.py::test_one",), ("test_toy.py::test_line",)}, outcome
    assert status == 0, outcome["why"]
    for group in groups.values():
        assert group["first_bad"] == {"package": "toypkg", "version": "2.0"}, group["why"]
        assert group["card"].startswith(
            "first bad for tonight's failure: toypkg 2.0 (ends as tonight in 5 of 5 runs); "
            "1.0 good in 5 of 5 runs"), group["card"]
        assert any(line.endswith("mismatch in 12 of 64 values")
                   for line in group["signature"]["statement"]), group["signature"]
        # 2.0 said the same failure another size: within 4x (8 and 12) it is not said
        bad = next(t for t in group["trials"] if t["assignment"] == {"toypkg": "2.0"})
        assert bad["why"].startswith("ends as tonight: test_toy.py::test_") \
            and "another size" not in bad["why"], bad
        # 3.0 could not be imported: its first error line, with the file and line
        broken = next(t for t in group["trials"] if t["assignment"] == {"toypkg": "3.0"})
        assert broken["verdict"] == "skip", broken
        assert "SyntaxError" in broken["why"] and "toypkg/__init__.py:" in broken["why"], \
            broken["why"]
        assert "no collectors" not in broken["why"] and broken["why"].startswith("pytest: ")


def test_a_boundary_release_failing_half_its_runs_is_flaky_with_its_rate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3.0 ends as tonight in half of its runs (a seeded coin), 4.0 on: the boundary's
    confirmation catches it: flaky, with its rate over the runs made, never passed over as
    good (tests/test_bisect.py runs the same 400 times for the rate)."""
    toy = _toy(tmp_path, "coin")
    monkeypatch.setenv("TOY_COUNTER", str(tmp_path / "counter"))
    monkeypatch.setenv("TOY_SEED", "3")  # its first two runs of 3.0 agree: good, good
    status, outcome = _bisect(toy, "state", "--test", "test_toy.py::test_one")
    [group] = outcome["groups"]
    assert status == 2, group["why"]
    assert group["search"]["tried"]["3.0"] == "flaky", group["search"]
    [flaky] = group["flaky"]
    assert flaky.startswith("toypkg 3.0: flaky: ended as tonight in ") and " of " in flaky
    assert "first_bad" not in group and "3.0" in group["search"]["unresolved"]
    assert group["card"].startswith(
        "culprit: toypkg; not found: toypkg: the first bad for tonight's failure is one of "
        "3.0, 4.0 (could not be judged: 3.0 (flaky: ended as tonight in 1 of 4 runs (else: "
        "good 3))), after 2.0 good"), group["card"]
    # the confirmation ran: more than the two first-pass runs of 3.0
    runs = [t["runs"] for t in group["trials"] if t["assignment"] == {"toypkg": "3.0"}]
    assert max(len(r) for r in runs) > 2 and runs[0][:2] == ["good", "good"], runs


def test_a_test_that_passes_on_both_nights_is_nothing_to_bisect(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toy = _toy(tmp_path, "plain")
    base = toy["base"]
    status = main([str(toy["good"]), str(toy["bad"]), "--test", "test_toy.py::test_line",
                   "--state", str(base / "state")])
    assert status == 3
    err = capsys.readouterr().err
    assert "nothing to bisect: --test test_toy.py::test_line passed on the good night" in err
    assert "and passed tonight" in err
    assert not (base / "state" / "bisect.json").exists()


def test_an_overlay_that_does_not_take_is_a_skip(tmp_path: Path) -> None:
    """A package of the same name in the rootdir (a checkout) comes first on sys.path: the
    candidate's overlay would not be what runs, so the trial is a skip, named."""
    from harness.bisect.search import SKIP
    from harness.bisect.trial import Runner

    overlays = Overlays(tmp_path / "ov")
    (overlays.folder("toypkg", "2.0") / "toypkg").mkdir(parents=True)
    (overlays.folder("toypkg", "2.0") / "toypkg" / "__init__.py").write_text("n = 2\n")
    (tmp_path / "suite" / "toypkg").mkdir(parents=True)
    (tmp_path / "suite" / "toypkg" / "__init__.py").write_text("n = 0\n")
    runner = Runner(["test_toy.py::test_one"], tmp_path / "suite", overlays, {})
    attempt = runner.run({"toypkg": "2.0"})
    assert attempt.verdict == SKIP
    assert attempt.why.startswith("the overlay did not take: toypkg is imported from "
                                  f"{tmp_path / 'suite' / 'toypkg'}"), attempt.why


def test_a_damaged_archive_is_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``git archive`` gives a damaged tar (a full disk, a broken pipe): the candidate
    cannot be put in place, a skip with tar's words, never a crash of the bisect."""
    from harness.bisect import overlay
    from harness.bisect.overlay import OverlayError

    real = subprocess.run

    def damaged(cmd: list[str], *args: object, **kwargs: object):
        if cmd[:1] == ["git"] and "archive" in cmd:
            return subprocess.CompletedProcess(cmd, 0, b"not a tar archive" * 64, b"")
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(overlay.subprocess, "run", damaged)
    overlays = Overlays(tmp_path / "ov", checkouts={"toypkg": tmp_path})
    with pytest.raises(OverlayError, match=r"toypkg git:abc could not be installed: tar -x"):
        overlays.get("toypkg", "git:abc")
    # remembered: the next candidate at that commit is the same skip, with no new try
    with pytest.raises(OverlayError, match="tar -x"):
        overlays.get("toypkg", "git:abc")
