import os
from unittest import mock


def helper():
    return "real"


@mock.patch.dict(os.environ, {}, clear=True)
def test_env_cleared():
    assert "PATH" not in os.environ


@mock.patch.dict(os.environ, {"PEER_FLAG": "1"})
def test_env_added():
    assert os.environ["PEER_FLAG"] == "1"


@mock.patch(f"{__name__}.helper", return_value="patched")
def test_patched_function(patched):
    assert helper() == "patched"


def test_unpatched_after():
    assert helper() == "real" and "PEER_FLAG" not in os.environ
