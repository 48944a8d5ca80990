"""Standalone reproducers of release findings (``npu-regress repro``): for a failing test of
a results file that the ledger names a release finding, a ``repro.py`` that imports only the
upstream stack (never ``harness``), its ``requirements.txt`` and an ``ISSUE.md`` to file
upstream.

A reproducer's exit status is its verdict: ``FOUND`` (1) while the bug is there, ``FIXED`` (0)
when it is gone, ``NEEDS_NPU`` (77) on a machine without the device it needs, ``CANNOT`` (2)
when the script itself cannot run (its requirements missing). A script is written out only
after it was run and failed as the finding says (``--verify``), or with its card saying it was
not run; one that does not fail on the affected release is never written as a reproducer.

Modules: ``recipe`` (what a recipe holds), ``recipes`` (one module a finding: the script,
its inputs, what it shrinks),
``issue`` (the issue body), ``verify`` (a fresh venv with only the requirements, the script
run there), ``command`` (the command line). Reads results files and the ledger; imports
nothing of the pytest face."""

from __future__ import annotations

FIXED, FOUND, CANNOT, NEEDS_NPU = 0, 1, 2, 77
EXIT_MEANING = {FIXED: "fixed (the expected behaviour)", FOUND: "the finding is there",
                CANNOT: "the script could not run (its requirements?)",
                NEEDS_NPU: "needs an NPU (none here)"}
