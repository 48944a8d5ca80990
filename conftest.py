"""Root conftest: the harness plugin itself arrives through the ``pytest11`` entry point
(``pip install -e .``); here we only enable pytester for the harness's own tests."""

pytest_plugins = ["pytester"]
