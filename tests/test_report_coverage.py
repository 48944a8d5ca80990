"""The report's switch coverage table: operators from each target's "switch, enabled"
footprint and functions from its rebinding checks, per runner, so a gap in one target is
visible beside the others; a malformed footprint is dropped, never shown as covered."""

from __future__ import annotations

from pathlib import Path

from harness.cli import main as cli
from harness.report.compare import compare
from harness.report.coverage import coverage
from harness.report.load import load_results
from tests.fixtures import nights

CASE = "suites/test_batch_invariant_switch.py::test_switch[{}-{}-enabled]"


def _write(path: Path, tests: list[object]) -> Path:
    """A night of ``tests`` on runner ``path.stem``: lines cut from a real night
    (tests/fixtures/nights.py)."""
    return nights.write(path, [nights.header(path.stem, "2026-12-02"), *tests,
                               nights.footer(exitstatus=0)])


def _test(target: str, check: str, outcome: str, **extra: object) -> dict[str, object]:
    return nights.result(CASE.format(target, check), outcome, **extra)


def _night(tmp_path: Path) -> Path:
    return _write(tmp_path / "cpu.jsonl", [
        _test("vllm_ascend", "switch", "passed", dispatcher_footprint={
            "aten::mm": ["PrivateUse1"], "aten::matmul": ["PrivateUse1"],
            "aten::sum": ["PrivateUse1"]}),
        _test("vllm_ascend", "torch_sum", "passed"),
        _test("vllm_ascend", "tensor_sum", "xfailed"),
        _test("vllm_ascend", "add_rms_norm", "passed"),
        _test("vllm_ascend", "fused_infer_attention_score", "passed"),
        _test("sglang", "switch", "passed", dispatcher_footprint={
            "aten::mm": ["PrivateUse1"], "aten::_log_softmax": ["PrivateUse1"]}),
        _test("sglang", "torch_sum", "skipped", reason="no sum override"),
        _test("sglang", "tensor_sum", "skipped", reason="no sum override"),
        _test("sglang", "add_rms_norm", "failed", longrepr="E boom"),
        _test("sglang", "fused_infer_attention_score", "passed"),
        _test("vllm", "switch", "skipped", reason="CUDA key only"),
        nights.Unchecked(_test("hostile", "switch", "passed",
                               dispatcher_footprint=["aten::mm"])),
    ])


def test_each_target_s_ops_and_functions_side_by_side(tmp_path: Path) -> None:
    path = _night(tmp_path)
    table = coverage(compare([load_results(path)], []))
    assert table.columns == ["aten::_log_softmax", "aten::matmul", "aten::mm", "aten::sum",
                             "torch.sum", "Tensor.sum", "add_rms_norm", "FIA"]
    rows = {r.target: r for r in table.rows}
    assert rows["vllm_ascend"].cells == ["-", "overridden", "overridden", "overridden",
                                         "yes", "FAILS (known finding)", "yes", "yes"]
    assert rows["sglang"].cells == ["overridden", "-", "overridden", "-",
                                    "-", "-", "FAILS", "yes"]
    assert rows["vllm"].note == "skipped: CUDA key only"
    # a footprint that is not {op: [keys]} is not read as covering anything
    assert rows["hostile"].cells[:4] == ["?"] * 4
    assert rows["hostile"].note == "switch case passed, no footprint recorded"


def test_the_page_shows_the_table_escaped(tmp_path: Path) -> None:
    path = _night(tmp_path)
    out = tmp_path / "report"
    assert cli(["report", "render", str(path), "--out", str(out)]) == 0
    page = (out / "report.html").read_text()
    table = page[page.index('id="switch-coverage"'):]
    table = table[:table.index("</table>")]
    assert '<td class="cov-bad">FAILS (known finding)</td>' in table
    assert "<td>sglang</td>" in table and 'colspan="8">skipped: CUDA key only' in table
