"""``npu-regress bisect``: from a red night to the first bad release.

Given the last green and tonight's results of one runner, it finds which of the packages that
changed between them makes tonight's failures (delta debugging over the changed packages,
each trial in an overlay of released versions), then which release of that package first
does (a binary search over the package index's releases between the two nights, or over a
checkout's commits with ``--source``). Each trial reruns the failing tests in a fresh
``pytest`` with the candidate versions overlaid; a candidate that cannot be installed or
collected, or that fails some other way, is a skip, never good or bad.

Layering: beside the pytest face (it drives ``pytest`` from outside, in subprocesses); it
reads results files through ``harness.report`` and installs the way the stack profiles do
(``harness.stack``); nothing below imports it.

Modules: ``endpoints`` (the two nights: what changed, which tests), ``index`` (released
versions), ``overlay`` (a candidate's packages, installed aside), ``trial`` (one candidate's
rerun and its verdict), ``search`` (delta debugging and the version search), ``state``
(resumable state, ``bisect.json``), ``controller`` (the command)."""
