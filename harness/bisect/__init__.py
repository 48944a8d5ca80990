"""``npu-regress bisect``: from a red night to the first bad release.

Given the last green and tonight's results of one runner, it groups tonight's new failures by
signature (the whole statement of a failure) and, for each group, finds which of the packages
that changed between the nights makes that failure (delta debugging over the changed
packages, each trial in an overlay of released versions), then which release of that package
first does (a binary search over the package index's releases between the two nights, or
over a checkout's commits with ``--source``). Each trial reruns the failing tests in a fresh
``pytest`` with the candidate versions overlaid, ``--runs`` times; runs that disagree are
flaky, and a candidate that cannot be installed or collected, or that fails in a way that
shares nothing with tonight's, is a skip, never good or bad.

Layering: beside the pytest face (it drives ``pytest`` from outside, in subprocesses); it
reads results files through ``harness.report`` and installs the way the stack profiles do
(``harness.stack``); nothing below imports it.

Modules: ``endpoints`` (the two nights: what changed, which tests), ``index`` (released
versions), ``overlay`` (a candidate's packages, installed aside), ``git`` (a checkout's
commits), ``signature`` (what "the same failure" means), ``trial`` (one candidate's runs and
their verdict), ``search`` (delta debugging and the version search), ``groups`` (a bisect per
distinct failure), ``driver`` (one group's search), ``card`` (the card lines), ``state``
(resumable state, ``bisect.json``), ``command`` (the command line)."""
