import logging
import os

import pytest


def test_capsys(capsys):
    print("hello")
    assert capsys.readouterr().out == "hello\n"


def test_capfd(capfd):
    os.write(1, b"fd\n")
    assert capfd.readouterr().out == "fd\n"


def test_caplog(caplog):
    logging.getLogger("peer").warning("logged")
    assert "logged" in caplog.text
    assert caplog.records[0].levelname == "WARNING"


def test_caplog_set_level(caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("peer").info("info line")
    assert caplog.messages == ["info line"]


def test_log_then_fail():
    logging.getLogger("peer").warning("peer-log-in-report")
    raise AssertionError("failing on purpose")


def test_monkeypatch(monkeypatch):
    monkeypatch.setattr(os, "sep", "!")
    monkeypatch.setenv("PEER_ENV", "x")
    assert os.sep == "!" and os.environ["PEER_ENV"] == "x"


def test_record_property(record_property):
    record_property("peer_key", "peer_value")


@pytest.mark.isolated(False)
def test_request_stays_in_process(request):
    assert request.node.name == "test_request_stays_in_process"
