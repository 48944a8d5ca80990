"""The released versions of a package between two nights, from the package index pip is
configured with (``pip index versions``: only versions with a file this Python can install
are listed; yanked ones are not), in version order."""

from __future__ import annotations

import subprocess
import sys

from packaging.version import InvalidVersion, Version


class IndexLookupError(RuntimeError):
    """The index could not be read, or does not list an endpoint (named)."""


def released(distribution: str, *, pip_options: tuple[str, ...] = (),
             pre: bool = False, python: str = sys.executable) -> list[str]:
    """Every version of ``distribution`` the index lists, oldest first."""
    done = subprocess.run([python, "-m", "pip", "index", "versions", distribution,
                           *(["--pre"] if pre else []), *pip_options],
                          capture_output=True, text=True, check=False, timeout=300)
    line = next((ln for ln in done.stdout.splitlines()
                 if ln.startswith("Available versions:")), None)
    if done.returncode != 0 or line is None:
        tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise IndexLookupError(f"pip index versions {distribution} failed (exit "
                          f"{done.returncode}): {tail}")
    versions = [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return sorted(versions, key=Version)


def between(distribution: str, good: str, bad: str, **kwargs: object) -> list[str]:
    """``[good, ..., bad]``: the two nights' versions and every release between them."""
    try:
        low, high = Version(good), Version(bad)
    except InvalidVersion as exc:
        raise IndexLookupError(f"{distribution}: {exc}: not a release version") from None
    pre = low.is_prerelease or high.is_prerelease
    listed = released(distribution, pre=pre, **kwargs)  # type: ignore[arg-type]
    versions = {Version(v): v for v in listed}
    missing = [v for v in (good, bad) if Version(v) not in versions]
    if missing:
        raise IndexLookupError(f"{distribution} {' and '.join(missing)} not on the index (it lists "
                          f"{', '.join(listed[-8:])}...): a build of its own; bisect its "
                          "commits with --source CHECKOUT")
    ordered = sorted(versions)
    if low > high:  # a downgrade: search from the good night's side all the same
        chosen = [v for v in ordered if high <= v <= low][::-1]
    else:
        chosen = [v for v in ordered if low <= v <= high]
    return [versions[v] for v in chosen]
