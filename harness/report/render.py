"""Write report.html (self-contained, inline SVG, no network), summary.md (fit for
$GITHUB_STEP_SUMMARY) and summary.json. Every string from a results file reaches HTML only
through jinja2 with autoescape on, and Markdown only through ``_md``, which neutralises
markup. The page's only style and script are our own static files, allowed by their hashes
in a Content-Security-Policy that lets nothing else load or run. What the page shows, and in
which order, is ``harness.report.page``."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import jinja2
from markupsafe import Markup

from harness.report import page
from harness.report.atomic import write_whole
from harness.report.compare import Comparison, changes_text
from harness.report.coverage import coverage

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
           "#7f7f7f")
CHART_W, CHART_H, PAD = 560, 180, 36


def _chart(comp: Comparison, key: str, label: str, fmt: str) -> dict[str, Any]:
    """Polylines (numbers only) per runner for one metric over the nights."""
    dates = sorted({p["date"] for pts in comp.trend.values() for p in pts})
    values = [p[key] for pts in comp.trend.values() for p in pts if p[key] is not None]
    top = max(values, default=1.0) or 1.0
    if key == "pass_rate":
        top = 1.0
    xs = {d: PAD + (CHART_W - 2 * PAD) * (i / max(len(dates) - 1, 1)) for i, d in
          enumerate(dates)}
    lines = []
    for i, (runner, pts) in enumerate(sorted(comp.trend.items())):
        coords = [(round(xs[p["date"]], 1), round(CHART_H - PAD - (CHART_H - 2 * PAD)
                                                  * (p[key] / top), 1))
                  for p in pts if p[key] is not None]
        lines.append({"runner": runner, "color": PALETTE[i % len(PALETTE)],
                      "points": " ".join(f"{x},{y}" for x, y in coords), "dots": coords})
    return {"label": label, "lines": lines, "dates": dates, "xs": xs, "top": fmt.format(top),
            "w": CHART_W, "h": CHART_H, "pad": PAD}


def _md(text: Any) -> str:
    """Plain text for Markdown tables: no HTML, no table breaks, no links, one line."""
    s = str(text).replace("\n", " ").replace("\r", " ")
    for ch, rep in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("[", "\\["),
                    ("]", "\\]"), ("`", "'")):
        s = s.replace(ch, rep)
    return s[:300]


#: the summary's sections, as summary.md names them
TITLES = {"new_failures": "New failures", "fixed": "Fixed", "still_failing": "Still failing",
          "flaky": "Flaky", "event_changes": "Dispatch-event counts changed",
          "figure_changes": "Figures changed (the size of a difference)",
          "newly_skipped": "Newly skipped", "upstream_drift": "Upstream API moved",
          "release_findings": "Findings about releases",
          "harness_causes": "The harness's own causes (ours, not the release's)",
          "unsupported_stack": "On an unsupported stack (the preflight's pairing failed)",
          "required_capability": "Required capabilities missing (the runner's, "
                                 "--harness-require)",
          "drift_grew": "Drift grew (a difference left its measured envelope)",
          "forward_compat": "Forward-compatibility (breaks with the next releases)",
          "fixed_upstream": "Fixed upstream: remove from the ledger",
          "known_findings": "Known release findings (the ledger; not new failures)",
          "vanished": "Vanished (not collected tonight)",
          "not_run": "Not run (the night ended before them)"}
#: the category sections (harness.plugin.verdicts), in the order summary.md lists them
CATEGORY_KEYS = ("drift_grew", "upstream_drift", "release_findings", "harness_causes",
                 "unsupported_stack", "required_capability",
                 "forward_compat", "fixed_upstream", "known_findings")
#: the rows of summary.md's count table, each once (drift grew is a category too)
COUNT_KEYS = tuple(dict.fromkeys(("new_failures", "drift_grew", "fixed", "still_failing",
                                  "flaky", "event_changes", "figure_changes", "newly_skipped",
                                  "vanished", "not_run", *CATEGORY_KEYS)))
#: rows of the skipped table in summary.md (all of them are in summary.json)
MD_SKIPPED_ROWS = 200
#: rows of every other table in summary.md
MD_ROWS = 500
#: summary.md stays under this (a CI step summary takes 1 MiB)
MD_LIMIT = 1000 * 1024
#: problems listed on the page (summary.json keeps the first MAX_PROBLEMS)
PAGE_PROBLEMS = 200


def _figures_text(figures: dict[str, float]) -> str:
    if "tokens" in figures:
        return (f"{figures['bit_equal']:.0f} of {figures['tokens']:.0f} bit-equal, max "
                f"{figures['max_ulp']:.0f} ULP, max |diff| {figures['max_abs']:.3g}, KL max "
                f"{figures['kl_max']:.3g}")
    return ", ".join(f"{name} {value:.3g}" for name, value in sorted(figures.items())[:8])


#: a sparkline's size (px) and the rows of drift trends drawn
SPARK_W, SPARK_H, SPARK_ROWS = 160, 28, 300


def _sparks(comp: Comparison) -> list[dict[str, Any]]:
    """Each drift trend as a sparkline (numbers only: SVG coordinates), with its bound as
    a dashed line where tonight was judged by an envelope."""
    out = []
    for row in comp.drift_trends(SPARK_ROWS):
        values = [v for _, v in row["points"]]
        top = max([*values, row["bound"] or 0.0]) or 1.0
        step = (SPARK_W - 8) / max(len(values) - 1, 1)

        def y(v: float, top: float = top) -> float:
            return round(SPARK_H - 4 - (SPARK_H - 8) * (v / top), 1)

        coords = [(round(4 + i * step, 1), y(v)) for i, v in enumerate(values)]
        out.append({**row, "w": SPARK_W, "h": SPARK_H, "dots": coords,
                    "line": " ".join(f"{x},{yy}" for x, yy in coords),
                    "bound_y": y(row["bound"]) if row["bound"] is not None else None,
                    "nights": len(values)})
    return out


def summary_markdown(comp: Comparison) -> str:
    s = comp.summary()
    lines = [f"# npu-regress nightly {_md(comp.date)}", "",
             f"Runners: {', '.join(_md(r) for r in comp.runners) or 'none'}; "
             f"{s['tests']} tests; compared with {len(comp.nights)} earlier night(s).", "",
             *[f"**{_md(a.text)}**" for a in page.alerts(comp)], "",
             "| | count |", "|---|---|"]
    for key in COUNT_KEYS:
        lines.append(f"| {TITLES[key]} | {len(s[key])} |")
    skipped = sum(s["skipped_by_reason"].values())
    lines.append(f"| Skipped | {skipped} |")
    if s["new_failures"]:
        lines += ["", f"## {TITLES['new_failures']}", "",
                  "| test | runner | outcome | last passed | what changed since (stack) |",
                  "|---|---|---|---|---|"]
        lines += _cap([_new_failure_row(r) for r in s["new_failures"][:MD_ROWS + 1]],
                      len(s["new_failures"]))
    if s["vanished"]:
        lines += ["", f"## {TITLES['vanished']}", "", "| test | runner | last seen |",
                  "|---|---|---|"]
        lines += _cap([f"| {_md(r['test'])} | {_md(r['runner'])} | {_md(r['since'])} |"
                       for r in s["vanished"][:MD_ROWS + 1]], len(s["vanished"]))
    for key in ("still_failing", "flaky", "fixed", "newly_skipped", "not_run",
                *CATEGORY_KEYS):  # new failures: above, with the hint
        if s[key]:
            lines += ["", f"## {TITLES[key]}", "", "| test | runner | outcome | since |",
                      "|---|---|---|---|"]
            lines += _cap([f"| {_md(r['test'])} | {_md(r['runner'])} | {_md(r['outcome'])} | "
                           f"{_md(r['since'] or '')} |" for r in s[key][:MD_ROWS + 1]],
                          len(s[key]))
    if s["event_changes"]:
        lines += ["", "## Dispatch-event counts changed since last night", "",
                  "| test | runner | before | now |", "|---|---|---|---|"]
        lines += _cap([f"| {_md(r['test'])} | {_md(r['runner'])} | "
                       f"{_md(r['events_before'])} | {_md(r['events_now'])} |"
                       for r in s["event_changes"][:MD_ROWS + 1]], len(s["event_changes"]))
    if s["figure_changes"]:
        lines += ["", "## Figures changed since last night", "",
                  "| test | runner | last night | tonight |", "|---|---|---|---|"]
        lines += _cap([f"| {_md(r['test'])} | {_md(r['runner'])} | "
                       f"{_md(_figures_text(r['figures_before']))} | "
                       f"{_md(_figures_text(r['figures_now']))}"
                       f"{' **no longer zero-diff**' if r['zero_diff_lost'] else ''} |"
                       for r in s["figure_changes"][:MD_ROWS + 1]], len(s["figure_changes"]))
    if s["skipped"]:
        rows = sorted(s["skipped"], key=lambda r: (r["status"] != "newly-skipped",
                                                   r["since"] or "", r["test"]))
        lines += ["", "## Skipped, since when", "", "| test | runner | skipped since | reason |",
                  "|---|---|---|---|"]
        lines += [f"| {_md(r['test'])} | {_md(r['runner'])} | {_md(r['since'])} | "
                  f"{_md(r['reason'])} |" for r in rows[:MD_SKIPPED_ROWS]]
        if len(rows) > MD_SKIPPED_ROWS:
            lines.append(f"| ... {len(rows) - MD_SKIPPED_ROWS} more in summary.json | | | |")
    if s["skipped_by_reason"]:
        lines += ["", "## Skipped, by reason", "", "| reason | count |", "|---|---|"]
        lines += _cap([f"| {_md(reason)} | {n} |" for reason, n in
                       list(s["skipped_by_reason"].items())[:MD_ROWS + 1]],
                      len(s["skipped_by_reason"]))
    if s["problems"]:
        lines += ["", "## Input problems (lines skipped)", ""]
        lines += [f"- {_md(p)}" for p in s["problems"][:50]]
        if s["problems_total"] > 50:
            lines.append(f"- ... {s['problems_total'] - 50} more (the first "
                         f"{len(s['problems'])} in summary.json)")
    return _within_limit(lines)


def _new_failure_row(r: dict[str, Any]) -> str:
    changed = changes_text(r["changes"]) or ("nothing" if r["last_passed"] else "")
    if r.get("bisect"):
        changed += f" · bisect: {r['bisect']}"
    return (f"| {_md(r['test'])} | {_md(r['runner'])} | {_md(r['outcome'])} | "
            f"{_md(r['last_passed'] or 'never in the window')} | {_md(changed)} |")


def _cap(rows: list[str], total: int) -> list[str]:
    """At most MD_ROWS table rows, then one that says where the rest are."""
    if total <= MD_ROWS:
        return rows
    return [*rows[:MD_ROWS], f"| ... {total - MD_ROWS} more rows in summary.json | | | |"]


def _within_limit(lines: list[str]) -> str:
    """summary.md under MD_LIMIT bytes (a CI step summary takes 1 MiB), cut at a line with
    one that says where the full lists are."""
    text = "\n".join(lines) + "\n"
    if len(text.encode()) <= MD_LIMIT:
        return text
    kept, size = [], 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > MD_LIMIT - 200:
            break
        kept.append(line)
    kept += ["", "**summary.md cut here to stay under 1 MiB: every row is in summary.json "
             "and report.html.**"]
    return "\n".join(kept) + "\n"


def _static(name: str) -> str:
    return (Path(__file__).parent / "templates" / name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def render(comp: Comparison, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.report", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
    )
    env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=1, sort_keys=True,
                                                        default=str)
    css, js = _static("report.css"), _static("report.js")
    # Strict: nothing loads from anywhere; only our own style and script, by hash, run.
    csp = (f"default-src 'none'; style-src {_sha256(css)}; script-src {_sha256(js)}; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    nights_seen = len({p["date"] for pts in comp.trend.values() for p in pts})
    matrices = page.family_matrices(comp)
    alerts = page.alerts(comp)
    html = env.get_template("report.html.j2").render(
        comp=comp, summary=comp.summary(), csp=csp, css=Markup(css), js=Markup(js),
        runner_lines=[page.runner_line(name, comp.runs[name]) for name in comp.runners
                      if name in comp.runs],
        news=page.news(comp), cards=page.failure_cards(comp), matrices=matrices,
        alerts=alerts, page_problems=PAGE_PROBLEMS, coverage=coverage(comp),
        incomplete=any(a.key in ("incomplete", "unreadable") for a in alerts),
        bars=page.family_bars(matrices), nights_seen=nights_seen,
        changed=sorted(comp.event_changes(), key=lambda c: (c.test, c.runner)),
        figures=sorted(comp.figure_changes(), key=lambda c: (not c.zero_diff_lost, c.test,
                                                             c.runner)),
        sparks=_sparks(comp),
        trend_charts=[_chart(comp, "pass_rate", "pass rate", "{:.0%}"),
                      _chart(comp, "duration", "suite duration (s)", "{:.0f}")]
        if nights_seen >= 2 else [],
    )
    files: dict[str, Callable[[IO[Any]], Any]] = {
        "report.html": lambda fh: fh.write(html),
        "summary.md": lambda fh: fh.write(summary_markdown(comp)),
        # streamed: json.dumps with indent would hold every small piece of a 10^6-test
        # night's summary in memory at once
        "summary.json": lambda fh: json.dump(comp.summary(), fh, indent=1, sort_keys=True,
                                             default=str),
    }
    written = []
    for name, write in files.items():
        write_whole(out / name, write)
        written.append(out / name)
    return written
