"""The isolation core: run one callable in a fresh process and bring back how it ended.

``run`` (``isolate``, ``run_isolated``: the parent side), ``child`` (what the child runs),
``server`` (the isolation servers: forkserver and spawn supervisor, subreapers of all they
start), ``reaper`` (ending process groups and descendants), ``result`` (``IsolatedResult``
and the ``IsolationError`` family), ``workdirs`` (the children's work folders).

Layer: below the check families and the pytest face; may import only the stack layer
(``harness.stack``) and its own modules.
"""
