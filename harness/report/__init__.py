"""Nightly reports: merge results files of several runners, compare with earlier nights,
and write report.html, summary.md and summary.json (``python -m harness report``)."""
