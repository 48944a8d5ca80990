"""`pytest suites/` writes the results file by default (reports/latest/results.jsonl under
the directory pytest was started in) unless --harness-results / ini harness_results says
otherwise; an empty --harness-results= turns it off."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("harness_results") is None and not config.getini("harness_results"):
        config.option.harness_results = "reports/latest/results.jsonl"


@pytest.hookimpl(optionalhook=True)
def pytest_harness_absent_target(item: pytest.Item) -> tuple[str, str] | None:
    """test_conformance's implementations: one the installed release does not have (vllm-ascend
    0.23.0.post1 has no vllm_ascend.device.hardware) is one skip, not one per machine."""
    callspec = getattr(item, "callspec", None)
    impl = callspec.params.get("impl") if callspec is not None else None
    if impl is None or getattr(item, "originalname", "") != "test_conformance":
        return None
    from harness.hardware.conformance import IMPLEMENTATIONS

    missing = IMPLEMENTATIONS[impl].installed()
    return (f"conformance with {impl}", missing) if missing else None
