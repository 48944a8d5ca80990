"""``npu-regress patches fingerprints``: the fingerprint report of the declared patches'
targets, read from the installed sources without importing them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.patches import declared
from harness.patches.fingerprint import load_previous, report


def add_parser(top: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    patches = top.add_parser("patches", help="the patch guard's fingerprint report")
    sub = patches.add_subparsers(dest="action", required=True)
    fp = sub.add_parser("fingerprints", help="fingerprint every declared patch target from "
                        "the installed sources (nothing imported)")
    fp.add_argument("--patch", action="append", metavar="NAME",
                    help="only this declared patch (repeatable; default: all)")
    fp.add_argument("--against", type=Path, metavar="JSON",
                    help="an earlier report (--json): say which kind of change each target "
                         "had since (whitespace, comments, meaning)")
    fp.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        previous = load_previous(args.against) if args.against else None
        patches = declared(args.patch)
    except (ValueError, KeyError) as exc:
        print(f"npu-regress patches: {exc.args[0]}", file=sys.stderr)
        return 2
    rows = report(patches, previous)
    for row in rows:
        where = f"{row['file']}:{row['line']}" if row["status"] == "found" else row["detail"]
        change = f"  change={row['change']}" if "change" in row else ""
        prints = f"  text={row['text']} meaning={row['meaning']}" if row["status"] == "found" \
            else ""
        print(f"{row['patch']}  {row['target']}  [{row['releases']}]{prints}{change}\n"
              f"    {where}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0
