"""A plain test file of the kind teams isolate with `pytest --forked`: fixtures, parameters,
a class, a skip. It must pass unchanged both as it is and under `--isolate-all`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


@pytest.fixture
def table() -> dict[str, int]:
    return {"rows": 4, "cols": 8}


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch.txt"
    path.write_text("ready")
    return path


def test_matmul_shape(table: dict[str, int]) -> None:
    a = torch.ones(table["rows"], table["cols"])
    assert (a @ a.T).shape == (4, 4)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_sum_of_arange(n: int) -> None:
    assert int(torch.arange(n).sum()) == n * (n - 1) // 2


def test_files_from_fixtures(scratch: Path) -> None:
    assert scratch.read_text() == "ready"
    scratch.write_text("written")


def test_env_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAIN_CHECK", "1")
    assert os.environ["PLAIN_CHECK"] == "1"


class TestDtypes:
    def setup_method(self) -> None:
        self.x = torch.arange(6, dtype=torch.float32)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_roundtrip(self, dtype: torch.dtype) -> None:
        assert torch.equal(self.x.to(dtype).float(), self.x)


@pytest.mark.skipif(not hasattr(torch, "npu"), reason="needs torch_npu")
def test_npu_only() -> None:
    assert torch.npu.is_available()
