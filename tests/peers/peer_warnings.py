import warnings

import pytest


def test_deprecation_is_an_error_under_W():
    warnings.warn("old api", DeprecationWarning)


@pytest.mark.filterwarnings("error")
def test_marked_error():
    warnings.warn("boom", UserWarning)


def test_plain_warning_passes():
    warnings.warn("peer-warning-in-summary", RuntimeWarning)


def test_recwarn(recwarn):
    warnings.warn("caught", UserWarning)
    assert len(recwarn) == 1 and str(recwarn[0].message) == "caught"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_ignored():
    warnings.warn("old api", DeprecationWarning)


def test_pytest_warns():
    with pytest.warns(UserWarning, match="expected"):
        warnings.warn("expected", UserWarning)
