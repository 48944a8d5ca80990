"""The stack and device layer: what is installed and on which device the checks run.

``devices`` (the session's device, probed in a subprocess; ``device()`` in a child),
``upstream`` (the installed upstream releases: versions, source files, declared symbols),
``dispatch`` (counting executed dispatcher events, kernel registrations).

Layer: the bottom; imports nothing else of the harness.
"""
