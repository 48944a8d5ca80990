import os

import pytest


@pytest.fixture
def box():
    state = {"opened": False}
    yield state
    assert state["opened"], "teardown did not see what the test changed"


class Counter:
    def __init__(self):
        self.hits = 0


@pytest.fixture
def counter():
    c = Counter()
    yield c
    assert c.hits == 2, f"teardown saw {c.hits} hits"


def test_yield_fixture_sees_the_change(box):
    box["opened"] = True


def test_yield_fixture_sees_an_object_change(counter):
    counter.hits += 2


def test_environment_has_nothing_of_the_harness():
    assert [k for k in os.environ if k.startswith("HARNESS_")] == []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_param(n):
    assert n != 2


class TestClassStyle:
    def setup_method(self):
        self.base = 10

    def test_method(self):
        assert self.base == 10
