"""`pytest suites/` writes the results file by default (reports/latest/results.jsonl under
the directory pytest was started in) unless --harness-results / ini harness_results says
otherwise; an empty --harness-results= turns it off."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("harness_results") is None and not config.getini("harness_results"):
        config.option.harness_results = "reports/latest/results.jsonl"
