"""The issue body a reproducer is filed with (``ISSUE.md``): what a maintainer asks first,
the environment, the steps, expected against observed, the harness's evidence and the
affected range."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.repro import EXIT_MEANING
from harness.repro.recipe import Recipe
from harness.stack.installed import distribution, entry_version
from harness.stack.ledger import Finding

#: the manifest entries that say what the machine is, in this order
ENVIRONMENT = ("soc", "family", "driver", "cann", "python", "torch", "torch_npu")


def issue_body(finding: Finding, recipe: Recipe, *, test_id: str, manifest: Mapping[str, Any],
               params: Mapping[str, int], verified: str, evidence: str,
               release: str | None = None, shrunk: list[str] | None = None) -> str:
    """``ISSUE.md``: ``verified`` says how the script was run and what it exited with;
    ``release`` the finding's distribution version; ``shrunk`` what was made smaller."""
    env = [f"- {finding.distribution}: {release}"] if release else []
    # each entry {"version", "source"} as the results file holds it (issue 67: it was shown
    # as the object); one not installed is left out
    shown = {k: f"{v} (read from {e['source']})" if isinstance(e, dict) and e.get("source")
             and e["source"] != "-" else v
             for k, e in manifest.items() if (v := entry_version(e)) not in (None, "", "absent")
             and not (release and distribution(k) == finding.distribution)}
    env += [f"- {k}: {shown[k]}" for k in ENVIRONMENT if k in shown]
    env += [f"- {k}: {v}" for k, v in sorted(shown.items()) if k not in ENVIRONMENT]
    sizes = ", ".join(f"{k} {v}" for k, v in params.items()) or "nothing to shrink"
    if shrunk:
        sizes += f"; shrunk from the case's while it still failed: {', '.join(shrunk)}"
    lines = [
        f"# {finding.title}", "",
        f"Affected: {finding.distribution} {finding.affected} (the ledger's range"
        + (f"; fixed upstream by {finding.fix}" if finding.fix else "") + ").", "",
        "## Environment", "", *(env or ["- (the results file has no stack manifest)"]), "",
        "## Steps", "",
        "```", "pip install -r requirements.txt",
        *(f"pip {' '.join(args)}" for args in recipe.after_install), "python repro.py", "```",
        "", *([f"(after the install: {recipe.after_install_why})", ""]
              if recipe.after_install_why else []),
        f"`repro.py` imports only the upstream stack. Inputs: {recipe.inputs} "
        f"({sizes}). Exit status: "
        + "; ".join(f"{code} {meaning}" for code, meaning in sorted(EXIT_MEANING.items()))
        + ".", "",
        "## Expected", "", recipe.expected, "",
        "## Observed", "", recipe.observed, "",
        "## How this was found", "",
        f"npu-regress's `{test_id}`; the finding's evidence: {finding.evidence}", "",
        *([f"What the check printed: {evidence}", ""] if evidence else []),
        (f"Reproducer: {verified}" if verified.startswith("written, not verified") else
         f"Reproducer verified: {verified}"), ""]
    return "\n".join(lines)
