import multiprocessing
import pickle
import sys
import threading

#: a module global that cannot pickle: the test module travels by name, not by value
LOCK = threading.Lock()


def square(x):
    return x * x


class Point:
    def __init__(self, x):
        self.x = x


def test_pool_over_a_module_function():
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(square, [1, 2, 3]) == [1, 4, 9]


def test_pickle_a_module_class():
    assert pickle.loads(pickle.dumps(Point(3))).x == 3


def test_module_lookup():
    assert sys.modules[Point.__module__].Point is Point


def test_rewritten_assert():
    assert square(2) == 5


def test_unpicklable_module_global_next_to_tmp_path(tmp_path):
    with LOCK:
        (tmp_path / "x").write_text("1")
    assert (tmp_path / "x").read_text() == "1"
