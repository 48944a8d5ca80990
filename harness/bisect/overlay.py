"""A candidate's packages, installed aside: each ``(distribution, version)`` once, in its
own folder under the bisect's state, the way the stack profiles install it (a wheel with
``--no-deps``; vllm-ascend's and SGLang's released sources, ``harness.stack.sources``; a
commit of a checkout, ``--source``), then put ahead of the environment on ``PYTHONPATH``
for a trial. The environment itself is never changed, torch never touched. A version that
cannot be installed is remembered as such (its pip text), and its candidate is a skip."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness.bisect.endpoints import COMMIT_PREFIX
from harness.stack.sources import (
    SOURCE_PACKAGES,
    SourcesError,
    soc_version,
    unpack,
    write_build_info,
)


class OverlayError(RuntimeError):
    """A version that cannot be installed here (pip's or git's text)."""


@dataclass
class Overlays:
    root: Path
    pip_options: tuple[str, ...] = ()
    #: ``--source``: distribution -> the checkout its commits come from
    checkouts: dict[str, Path] = field(default_factory=dict)
    python: str = sys.executable

    def folder(self, distribution: str, version: str) -> Path:
        safe = version.replace(COMMIT_PREFIX, "git-").replace("/", "_")
        return self.root / f"{distribution}-{safe}"

    def get(self, distribution: str, version: str) -> Path:
        """The folder holding ``distribution`` at ``version``, installed on first use."""
        folder = self.folder(distribution, version)
        failed = folder.with_name(folder.name + ".failed")
        if folder.is_dir():
            return folder
        if failed.is_file():
            raise OverlayError(failed.read_text(encoding="utf-8"))
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            if version.startswith(COMMIT_PREFIX):
                self._commit(distribution, version[len(COMMIT_PREFIX):], partial)
            elif distribution in SOURCE_PACKAGES:
                unpack(distribution, version, partial, python=self.python,
                       pip_options=self.pip_options)
            else:
                self._wheel(distribution, version, partial)
        except (OverlayError, SourcesError, OSError) as exc:
            shutil.rmtree(partial, ignore_errors=True)
            failed.write_text(f"{distribution} {version} could not be installed: {exc}",
                              encoding="utf-8")
            raise OverlayError(failed.read_text(encoding="utf-8")) from None
        partial.rename(folder)
        return folder

    def _wheel(self, distribution: str, version: str, into: Path) -> None:
        done = subprocess.run([self.python, "-m", "pip", "install", "-q", "--no-deps",
                               "--no-compile", "--target", str(into), *self.pip_options,
                               f"{distribution}=={version}"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise OverlayError(f"pip install --no-deps {distribution}=={version} (exit "
                               f"{done.returncode}): " + " / ".join(tail))

    def _commit(self, distribution: str, commit: str, into: Path) -> None:
        """The distribution's package folder at ``commit`` of its checkout (``git archive``:
        the checkout's work tree is not touched)."""
        checkout = self.checkouts.get(distribution)
        if checkout is None:
            raise OverlayError(f"no --source checkout for {distribution}")
        package = SOURCE_PACKAGES.get(distribution, distribution.replace("-", "_"))
        paths = [package] + (["setup.py"] if distribution == "vllm-ascend" else [])
        into.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(checkout), "archive", "--format=tar",
                                  commit, *paths], capture_output=True, check=False)
        if archive.returncode != 0:
            raise OverlayError(f"git archive {commit[:12]} {' '.join(paths)} in {checkout}: "
                               + archive.stderr.decode(errors="replace").strip()[-300:])
        unpacked = subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout,
                                  capture_output=True, check=False)
        if unpacked.returncode != 0:  # a damaged archive is a skip, never a crash
            raise OverlayError(f"tar -x of {distribution} {commit[:12]} (exit "
                               f"{unpacked.returncode}): "
                               + unpacked.stderr.decode(errors="replace").strip()[-300:])
        if distribution == "vllm-ascend" and (into / "setup.py").is_file():
            try:
                write_build_info(into, soc_version())
            except Exception as exc:  # noqa: BLE001 - an old setup.py: the import will say
                raise OverlayError(f"vllm-ascend {commit[:12]}: its setup.py's "
                                   f"gen_build_info failed ({exc})") from None

    def pythonpath(self, assignment: dict[str, str], installed: dict[str, str | None],
                   ) -> list[Path]:
        """The folders to put first on ``PYTHONPATH`` for ``assignment`` (distribution ->
        version): every distribution not already installed at that version."""
        return [self.get(dist, version) for dist, version in sorted(assignment.items())
                if installed.get(dist) != version]


def installed_versions(python: str) -> dict[str, str | None]:
    """This environment's versions of the manifest's packages, by distribution (read in a
    fresh interpreter, as the manifest reads them): a candidate at one of them needs no
    overlay."""
    code = ("import json; from harness.stack.installed import distribution, read_packages;"
            "e = read_packages(); print(json.dumps({distribution(k): v['version'] "
            "for k, v in e.items()}))")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
