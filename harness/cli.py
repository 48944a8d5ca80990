"""``python -m harness report ...`` and ``python -m harness patches ...`` (also the
``npu-regress`` console script)."""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from pathlib import Path
from typing import Any

from harness.drift.adopt import MIN_RUNS
from harness.drift.baselines import DEFAULT_FOLDER
from harness.drift.baselines import ENV as BASELINES_ENV
from harness.report import bisect_outcomes, repro_outcomes
from harness.report import history_folder as hist
from harness.report.compare import check_clocks, compare, tonight_date
from harness.report.load import Problems, load_any
from harness.report.render import render

#: problems printed to stderr (all kept ones are in summary.json)
MAX_WARNINGS = 50


def _nights(text: str) -> int:
    """--keep: a whole number of nights, 1 or more (0 or -1 used to keep everything)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give the number of nights to keep, a whole number of 1 or more "
            f"(default {hist.DEFAULT_KEEP})")
    return value


def _date(text: str) -> str:
    """--date: a real calendar date written YYYY-MM-DD."""
    try:
        if len(text) != 10:  # fromisoformat also takes 20261130 and 2026-W48-1
            raise ValueError(text)
        return _dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date written YYYY-MM-DD (for example "
            f"{_dt.datetime.now(_dt.timezone.utc).date().isoformat()})") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="npu-regress", description="npu-regress reports")
    top = parser.add_subparsers(dest="command", required=True)
    report = top.add_parser("report", help="merge results files into a nightly report")
    sub = report.add_subparsers(dest="action", required=True)
    render_p = sub.add_parser("render", help="write report.html, summary.md, summary.json")
    render_p.add_argument("results", nargs="+", type=Path,
                          help="results.jsonl files (or JUnit .xml from other runners)")
    render_p.add_argument("--out", type=Path, required=True, help="output directory")
    render_p.add_argument("--history", type=Path, help="earlier nights (report history add)")
    render_p.add_argument("--bisect", type=Path, nargs="+", default=[], metavar="BISECT_JSON",
                          help="npu-regress bisect outcomes to show on their failures' cards")
    render_p.add_argument("--repro", type=Path, nargs="+", default=[], metavar="REPRO_DIR",
                          help="npu-regress repro folders: copied beside the report, named on "
                               "their tests' cards")
    history_p = sub.add_parser("history", help="manage the nights kept for comparison")
    hsub = history_p.add_subparsers(dest="history_action", required=True)
    add_p = hsub.add_parser("add", help="file tonight's results under their date")
    add_p.add_argument("results", nargs="+", type=Path)
    add_p.add_argument("--history", type=Path, required=True)
    add_p.add_argument("--keep", type=_nights, default=hist.DEFAULT_KEEP,
                       help=f"nights to keep, 1 or more (default {hist.DEFAULT_KEEP})")
    add_p.add_argument("--date", type=_date, help="file under this date (YYYY-MM-DD) "
                       "instead of the results' start date (UTC)")
    from harness.patches import fingerprint_report as patches_cli

    patches_cli.add_parser(top)
    exp = top.add_parser("expectations", help="the measured envelopes of the rows that may "
                         "differ (docs/drift.md)")
    esub = exp.add_subparsers(dest="action", required=True)
    upd = esub.add_parser("update", help="adopt the figures of these runs as the envelopes of "
                          "their rows: the data files change, review the diff",
                          description="Each drift record names the runner it was judged as "
                          "(its identity: the accelerator or CPU and the torch threads); the "
                          "runs of one runner make that runner's envelope of a row, beside "
                          "the row's other runners'. $NPU_REGRESS_IDENTITY (field=value,...) "
                          "replaces identity fields when the suites run.")
    upd.add_argument("results", nargs="+", type=Path, help="results.jsonl files, one per run "
                     "(5 or more: the spread)")
    learn = esub.add_parser("learn", help="propose envelopes from this runner's own last "
                            "nights (the report's history folder) into the baselines folder: "
                            "review the diff and commit it")
    learn.add_argument("--history", type=Path, required=True, metavar="DIR",
                       help="the report's history folder (npu-regress report history add)")
    learn.add_argument("--runner", required=True, metavar="NAME",
                       help="the runner whose nights to learn from")
    learn.add_argument("--nights", type=_nights, default=MIN_RUNS, metavar="N",
                       help=f"the last N nights (default {MIN_RUNS}); a row needs all N")
    for sub in (upd, learn):
        sub.add_argument("--check", action="store_true",
                         help="write nothing; exit 1 if the data files would change")
        sub.add_argument("--baselines", type=Path, default=None, metavar="DIR",
                         help="the folder of this runner's envelopes in your repository "
                              f"(default: ${BASELINES_ENV}, else ./{DEFAULT_FOLDER}); "
                              "written there, never into the installed package")
        sub.add_argument("--accept-growth", metavar="REASON", default=None,
                         help="adopt runs whose row grew (refused otherwise), keeping REASON "
                              "and the old envelope in the row's history")
    upd.add_argument("--min-runs", type=_nights, default=MIN_RUNS, metavar="N",
                     help=f"write a row only when measured over N runs or more (default "
                          f"{MIN_RUNS})")
    upd.add_argument("--package-tables", action="store_true",
                     help="write the tables shipped in the package (this project's CI's), "
                          "from a source checkout only")
    from harness.repro.command import add_parser as add_repro

    add_repro(top)
    from harness.collectives.launchers import node

    node.add_arguments(top.add_parser(
        "ranks-node", help="a fleet's other node: run its ranks of the collectives checks "
        "that node 0 posts (--ranks-launcher torchrun; docs/collectives.md)"))
    top.add_parser("bisect", add_help=False,
                   help="from a red night to the first bad release (npu-regress bisect -h)")
    return parser


def _expectation_tables() -> dict[str, Any]:
    """Every family's expectation table (its data file), by the name its drift records use."""
    from harness.collectives import expected
    from harness.drift.table import load
    from harness.logprobs import expectations

    return {"logprobs": load(expectations.DATA, expectations.KEY_FIELDS),
            "collectives": load(expected.DATA, expected.KEY_FIELDS)}


def _expectations(args: argparse.Namespace) -> int:
    """``expectations update`` / ``learn``: into the user's baselines folder (or, with
    ``--package-tables`` from a checkout, the shipped tables)."""
    import os

    from harness.drift import baselines
    from harness.drift.adopt import update

    today = _dt.date.today().isoformat()
    if args.action == "learn":
        results = _learned_nights(args.history, args.runner, args.nights)
        if isinstance(results, str):
            print(f"npu-regress expectations learn: {results}", file=sys.stderr)
            return 2
        min_runs = args.nights
    else:
        results, min_runs = args.results, args.min_runs
    if getattr(args, "package_tables", False):
        import harness

        if any(part in ("site-packages", "dist-packages")
               for part in Path(harness.__file__).resolve().parts):
            print("npu-regress expectations: --package-tables writes the tables shipped in "
                  f"the package, and this one is installed ({Path(harness.__file__).parent}): "
                  "the next install would lose them. Use --baselines DIR (your repository)",
                  file=sys.stderr)
            return 2
        return update(results, _expectation_tables, check=args.check,
                      accept_growth=args.accept_growth, min_runs=min_runs, today=today)
    base = args.baselines or Path(os.environ.get(baselines.ENV) or baselines.DEFAULT_FOLDER)
    if base.exists() and not base.is_dir():
        print(f"npu-regress expectations: --baselines {base} is not a folder: give the "
              "folder of your repository that holds the runner's envelopes", file=sys.stderr)
        return 2

    def user_tables() -> dict[str, Any]:
        return {name: baselines.writable(name, table, base)
                for name, table in _expectation_tables().items()}

    return update(results, user_tables, check=args.check, shipped=_expectation_tables,
                  accept_growth=args.accept_growth, min_runs=min_runs, today=today)


def _learned_nights(history: Path, runner: str, nights: int) -> list[Path] | str:
    """The runner's last ``nights`` results files in the history folder, newest first; or
    why there are too few."""
    if not history.is_dir():
        return f"--history {history} is not a folder: give the report's history folder"
    found: list[Path] = []
    before: str | None = None
    while len(found) < nights:
        path = hist.latest_night(history, runner, before)
        if path is None:
            break
        found.append(path)
        before = path.parent.name
    if len(found) < nights:
        return (f"runner {runner!r} has {len(found)} night(s) in {history}, {nights} are "
                "needed (--nights): its rows are still learning; run again after more nights")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bisect"]:  # its own parser: its exit statuses are 0 found, 2 not
        from harness.bisect.command import main as bisect  # found, 3 unusable inputs

        return bisect(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "expectations":
        return _expectations(args)
    if args.command == "ranks-node":
        from harness.collectives.launchers import node

        return node.main(args)
    if args.command == "repro":
        from harness.repro.command import main as repro

        return repro(args)
    if args.command == "patches":
        from harness.patches import fingerprint_report as patches_cli

        return patches_cli.run(args)
    if args.action == "history":
        messages = hist.add(args.results, args.history, keep=args.keep, date=args.date)
        for line in messages:
            print(line)
        return 1 if messages.refused else 0
    if args.history is not None and not args.history.is_dir():
        what = "is not a folder" if args.history.exists() else "does not exist"
        print(f"npu-regress: --history {args.history} {what}: every failure would read as "
              "new. Give the folder that `npu-regress report history add` files the nights "
              "in (create it empty for a first night)", file=sys.stderr)
        return 2
    loaded = [load_any(p) for p in args.results]
    bad = [run for run in loaded if run.refused]
    for run in bad:  # named as what it is; the other inputs still render
        print(f"npu-regress: {run.path}: {run.refused}", file=sys.stderr)
    tonight = [run for run in loaded if not run.refused]
    if not tonight:
        print("npu-regress: no readable results file among the inputs: nothing rendered",
              file=sys.stderr)
        return 2
    check_clocks(tonight)
    date, _ = tonight_date(tonight)
    history_problems = Problems()
    comp = compare(tonight, hist.load_history(args.history, before=date,
                                              problems=history_problems, tonight=tonight))
    comp.problems.extend(history_problems)
    comp.problems.extend(f"{run.path}: {run.refused}" for run in bad)
    outcomes, bisect_problems = bisect_outcomes.load(args.bisect)
    comp.problems.extend(bisect_problems)
    comp.problems.extend(bisect_outcomes.attach(comp, outcomes))
    reproducers, repro_problems = repro_outcomes.load(args.repro)
    comp.problems.extend(repro_problems)
    try:
        comp.problems.extend(repro_outcomes.attach(comp, reproducers, args.out))
        written = render(comp, args.out)
    except OSError as exc:
        print(f"npu-regress: --out {args.out}: cannot write the report there ({exc}); "
              "give a writable folder", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    for problem in comp.problems[:MAX_WARNINGS]:
        print(f"warning: {problem}", file=sys.stderr)
    if comp.problems.total > MAX_WARNINGS:
        print(f"warning: ... {comp.problems.total - MAX_WARNINGS} more problems (the first "
              f"{len(comp.problems)} are in summary.json)", file=sys.stderr)
    lost = sum(run.unreadable + run.recovered for run in tonight)
    if lost:
        print(f"npu-regress: {lost} result line(s) could not be read "
              f"({sum(run.recovered for run in tonight)} recovered by id and outcome): the "
              "report says so on its first screen; exit status 1", file=sys.stderr)
    newer = [run for run in tonight if run.schema_problem]
    for run in newer:
        print(f"npu-regress: {run.path}: {run.schema_problem}; exit status 1", file=sys.stderr)
    return 1 if bad or lost or newer else 0
