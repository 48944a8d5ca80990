"""Released Python sources that the harness reads or puts on ``sys.path`` instead of
installing the package: vllm-ascend's sdist (its native build needs CANN), SGLang's wheel
(its PyPI wheel declares the CUDA target's requirements) and torch-npu's wheel (read, never
imported: importing it needs its torch and CANN). One place for how each is unpacked, used by
``ci/upstream.sh`` (the stack profiles) and by ``npu-regress bisect`` (a candidate release).

``python -m harness.stack.sources unpack NAME VERSION DEST``: the release's files under
DEST (exit 1 naming what failed)."""

from __future__ import annotations

import ast
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile
from pathlib import Path

#: distributions taken as sources, and the top-level package each contributes
SOURCE_PACKAGES = {"vllm-ascend": "vllm_ascend", "sglang": "sglang", "torch-npu": "torch_npu"}
#: vllm-ascend's files besides its package: its pairing matrix (the preflight), its
#: requirements (the profile's verify) and the setup.py whose gen_build_info() is run
ASCEND_EXTRA = ("docs/source/community/versioning_policy.md", "requirements.txt", "setup.py")
#: the chip vllm-ascend's build-time file is written for when $SOC_VERSION is unset
DEFAULT_SOC = "ascend910b1"


def soc_version() -> str:
    """The chip vllm-ascend's build-time file is written for: ``$SOC_VERSION``, else
    ``DEFAULT_SOC``."""
    return os.environ.get("SOC_VERSION") or DEFAULT_SOC


class SourcesError(RuntimeError):
    """A release whose sources could not be fetched or unpacked (named, with pip's text)."""


def _download(python: str, requirement: str, into: Path, *, sdist: bool,
              pip_options: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Path:
    kind = ["--no-binary", ":all:", "--no-build-isolation"] if sdist \
        else ["--only-binary", ":all:"]
    done = subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", *kind,
                           *pip_options, "-d", str(into), requirement],
                          capture_output=True, text=True, env=env, check=False)
    files = sorted(into.glob("*.tar.gz" if sdist else "*.whl"))
    if done.returncode != 0 or not files:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SourcesError(f"pip download {requirement} failed (exit {done.returncode}): "
                           + " / ".join(tail))
    return files[0]


def write_build_info(dest: Path, soc: str) -> str:
    """vllm_ascend/_build_info.py, written by the release's own setup.py ``gen_build_info``
    (for ``soc``); its last line."""
    tree = ast.parse((dest / "setup.py").read_text(encoding="utf-8"))
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "gen_build_info")
    scope = {"os": os, "logging": logging, "ROOT_DIR": str(dest),
             "envs": types.SimpleNamespace(SOC_VERSION=soc)}
    exec(compile(ast.Module([fn], []), "setup.py", "exec"), scope)  # noqa: S102
    scope["gen_build_info"]()
    return (dest / "vllm_ascend" / "_build_info.py").read_text().splitlines()[-1]


def unpack(name: str, version: str, dest: Path, *, python: str = sys.executable,
           pip_options: tuple[str, ...] = ()) -> Path:
    """``name==version``'s sources under ``dest`` (``dest/<package>/...``), written aside
    and moved in whole, so that a half-unpacked tree is never taken for a release."""
    if name not in SOURCE_PACKAGES:
        raise SourcesError(f"no sources layout for {name!r}: known {', '.join(SOURCE_PACKAGES)}")
    package = SOURCE_PACKAGES[name]
    dest = Path(dest)
    partial = dest.with_name(dest.name + ".partial")
    with tempfile.TemporaryDirectory() as tmp:
        download = Path(tmp)
        if name == "vllm-ascend":
            soc = soc_version()
            # the sdist's metadata step runs its setup.py: it needs setuptools_scm and wheel
            # (the [upstream] extra) and a SOC_VERSION, or it asks npu-smi for the chip
            sdist = _download(python, f"{name}=={version}", download, sdist=True,
                              pip_options=pip_options, env={**os.environ, "SOC_VERSION": soc})
            with tarfile.open(sdist) as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(download, filter="data")
                else:  # Python before 3.10.12 / 3.11.4
                    tar.extractall(download)  # noqa: S202
            root = download / f"vllm_ascend-{version}"
            _replace(partial)
            shutil.copytree(root / package, partial / package)
            for extra in ASCEND_EXTRA:
                target = partial / extra
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes((root / extra).read_bytes())
            write_build_info(partial, soc)
        else:
            wheel = _download(python, f"{name}=={version}", download, sdist=False,
                              pip_options=pip_options)
            _replace(partial)
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith(f"{package}/")]
                if name == "torch-npu":  # headers and Python files: read, never imported
                    members = [n for n in members if n.endswith((".py", ".h"))]
                zf.extractall(partial, members)
    _replace(dest)
    partial.rename(dest)
    return dest


def _replace(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if (args[:1], len(args)) not in ((["unpack"], 4), (["build-info"], 3)):
        print("usage: python -m harness.stack.sources unpack NAME VERSION DEST | "
              "build-info DEST SOC", file=sys.stderr)
        return 2
    try:
        if args[0] == "build-info":  # again for another chip, or after an upgrade
            line = write_build_info(Path(args[1]), args[2])
            print(f"npu-regress upstream: vllm_ascend/_build_info.py written by its setup.py "
                  f"for SOC_VERSION={args[2]}: {line}")
            return 0
        unpack(args[1], args[2], Path(args[3]))
    except (SourcesError, OSError, StopIteration) as exc:
        print(f"npu-regress sources: {args[1]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
