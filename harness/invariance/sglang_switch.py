"""SGLang's switch, turned the way its users turn it: ``--enable-deterministic-inference``
reaches ``get_exec().deterministic.enable_deterministic_inference``, which
``ModelRunner.maybe_enable_batch_invariant_mode`` reads to call
``enable_batch_invariant_mode()`` (``sglang/srt/model_executor/model_runner.py``).

A ModelRunner needs a model, a device and SGLang's runtime context; the method needs only
the flag. So the child runs the release's own method, read from its source file (as
``ci/upstream.sh`` runs vllm-ascend's ``gen_build_info``), with ``get_exec`` answering the
flag: the gate is the release's code, a renamed flag or method is an upstream API that moved.

What the switch modules import is imported without two package ``__init__``s that pull in
the rest of SGLang and are not part of the switch: ``sglang`` (the frontend language) and
``sglang.srt.layers.deep_gemm_wrapper`` (its entry point imports every model config, and
those need torchvision); the switch reads only ``deep_gemm_wrapper.configurer``. Child side.
"""

from __future__ import annotations

import ast
import types
from typing import Any

from harness.stack.upstream import UpstreamApiMoved, import_upstream, release, source_file

MODULE = "sglang.srt.batch_invariant_ops.batch_invariant_ops"
SKIP_INITS = ("sglang", "sglang.srt.layers.deep_gemm_wrapper")
RUNNER = "sglang.srt.model_executor.model_runner"
METHOD = ("ModelRunner", "maybe_enable_batch_invariant_mode")
FLAG = "--enable-deterministic-inference"


def load() -> types.ModuleType:
    """The switch module, imported as described above."""
    return import_upstream(MODULE, skip_inits=SKIP_INITS)


def _method() -> Any:
    """``ModelRunner.maybe_enable_batch_invariant_mode`` compiled from the release's file."""
    path = source_file(RUNNER)
    if path is None:
        raise UpstreamApiMoved(f"upstream API moved: {release('sglang')} has no {RUNNER}")
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == METHOD[0]),
               None)
    fn = next((n for n in (cls.body if cls else ()) if isinstance(n, ast.FunctionDef)
               and n.name == METHOD[1]), None)
    if fn is None:
        raise UpstreamApiMoved(f"upstream API moved: {release('sglang')} has no "
                            f"{RUNNER}.{'.'.join(METHOD)} (how {FLAG} turns the switch on)")
    return compile(ast.Module([fn], []), str(path), "exec"), fn.lineno


def turn_switch(enabled: bool) -> str:
    """Run the release's gate with ``FLAG`` given (``enabled``) or not; returns where the
    gate is, for the evidence."""
    code, line = _method()
    flags = types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=enabled))
    scope: dict[str, Any] = {"get_exec": lambda: flags}
    exec(code, scope)  # noqa: S102 - the release's own method, read from its file
    scope[METHOD[1]](None)  # its self is not read
    return f"{RUNNER.replace('.', '/')}.py:{line} {'.'.join(METHOD)}"
