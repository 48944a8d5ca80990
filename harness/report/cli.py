"""``python -m harness report ...`` and ``python -m harness patches ...`` (also the
``npu-regress`` console script)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report import history as hist
from harness.report.compare import compare, tonight_date
from harness.report.load import load_any
from harness.report.render import render


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
    history_p = sub.add_parser("history", help="manage the nights kept for comparison")
    hsub = history_p.add_subparsers(dest="history_action", required=True)
    add_p = hsub.add_parser("add", help="file tonight's results under their date")
    add_p.add_argument("results", nargs="+", type=Path)
    add_p.add_argument("--history", type=Path, required=True)
    add_p.add_argument("--keep", type=int, default=hist.DEFAULT_KEEP,
                       help=f"nights to keep (default {hist.DEFAULT_KEEP})")
    add_p.add_argument("--date", help="file under this date (YYYY-MM-DD) instead of the "
                                      "results' start date")
    from harness.patches import cli as patches_cli

    patches_cli.add_parser(top)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "patches":
        from harness.patches import cli as patches_cli

        return patches_cli.run(args)
    missing = [str(p) for p in args.results if not p.is_file()]
    if missing:
        print(f"npu-regress: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.action == "history":
        for line in hist.add(args.results, args.history, keep=args.keep, date=args.date):
            print(line)
        return 0
    tonight = [load_any(p) for p in args.results]
    date, _ = tonight_date(tonight)
    history_problems: list[str] = []
    comp = compare(tonight, hist.load_history(args.history, before=date,
                                              problems=history_problems, tonight=tonight))
    comp.problems.extend(history_problems)
    try:
        written = render(comp, args.out)
    except OSError as exc:
        print(f"npu-regress: --out {args.out}: cannot write the report there ({exc}); "
              "give a writable folder", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    for problem in comp.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0
