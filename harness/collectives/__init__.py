"""Collectives: multi-rank checks of what a switch's collective settings promise.

``ranks`` (spawned ranks with a process group, none outlives its check, a dead or hung rank
named), ``inputs`` (seeded rows with widened exponents), ``ops`` (the collectives and the
two controls), ``properties`` (the rank-side measurement and the parent's reading),
``settings`` (the settings the target's switch set, checked against ``declared.toml``),
``expected`` (what each collective must show per backend) and ``case`` (one case in its
isolated child).

Layer: a check family. May import the isolation core, the stack layer and the invariance
family (a target's switch), never the pytest face or the report.
"""
