"""The environment an inner pytest run of the harness's tests starts with."""

from __future__ import annotations

import os


def inner_environ(*, every_plugin: bool = False) -> dict[str, str]:
    """This process's environment less what belongs to this session (``PYTEST_*`` such as
    the current test and xdist's worker, ``HARNESS_*``). The lean plugin list
    (``PYTEST_ADDOPTS``, tests/conftest.py) is kept, unless ``every_plugin``: a run that
    mirrors a user's job loads every installed plugin, as users have them."""
    return {k: v for k, v in os.environ.items()
            if (k == "PYTEST_ADDOPTS" and not every_plugin)
            or not k.startswith(("PYTEST_", "HARNESS_"))}
