"""Fake: the real get_ascend_config needs a live vLLM config; un-patched it raises."""


def get_ascend_config():
    raise RuntimeError("Ascend config is not initialized. Please call init_ascend_config first.")
