"""The package's layers, read from its imports with ``ast`` (every import, lazy ones inside
functions included; ``if TYPE_CHECKING:`` blocks left out, they never run):

    harness (the public API, ``__main__``, ``cli``) -> plugin (the pytest face), bisect
    (which drives pytest from outside)
    -> invariance, logprobs, hardware, patches (the check families)
    -> isolation (the core) -> stack (devices, upstream, dispatch)

Imports go down or stay in a layer, never up; ``report`` reads files only and imports no
other part of the harness (only the top, the pytest face and the bisect may use it); and no module
imports itself back through any chain (no circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "harness"
#: package -> rank: lower ranks may import higher ones, never the reverse
RANKS = {"": 0, "plugin": 1, "bisect": 1, "repro": 1, "invariance": 2, "logprobs": 2, "hardware": 2, "patches": 2,
         "collectives": 2,
         "isolation": 3, "stack": 4, "drift": 4}
REPORT = "report"
#: the results file's contract and its one parser: at the bottom, where every reader may
#: use them (they import nothing of the harness but each other)
CONTRACT = ("harness.report.schema", "harness.report.load")
#: packages of one rank that must not import each other: the tools that read results files
#: from outside (the bisect, the reproducer) and the pytest face
APART = (("plugin", "bisect"), ("plugin", "repro"), ("bisect", "repro"))
#: the check families: none imports a sibling, but for what every family shares with the
#: switch family (``SWITCH_SHARED``): the targets' registry (how each release's switch is
#: turned, ``get_target``) and the CPU stand-in for torch_npu's native ops
FAMILIES = ("invariance", "logprobs", "hardware", "patches", "collectives")
SWITCH_SHARED = ("harness.invariance", "harness.invariance.standin")
#: where stand-ins live (what takes the place, on a CPU, of something that cannot exist
#: there: torch_npu's native ops, triton-ascend, verl's device platform): beside the switch
#: family's targets, shared by every family, and nowhere else; a module elsewhere that
#: subclasses an upstream's class (the shape of a stand-in) is named
STANDINS = "harness.invariance.standin"
#: the packages whose classes a stand-in subclasses
UPSTREAMS = ("torch_npu", "verl", "vllm", "vllm_ascend", "sglang", "triton")
#: top-level modules besides the layer packages
TOP_MODULES = {"__init__.py", "__main__.py", "cli.py"}
#: not part of the package: the source of the vLLM plugin's own top-level module
#: (``npu_regress_step_log``), which imports nothing of the harness (tests/test_step_log.py)
VLLM_PLUGIN_SOURCE = PACKAGE / "vllm_plugin"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")
            if VLLM_PLUGIN_SOURCE not in p.parents}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The harness module an import names (its longest known prefix)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    return skipped


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every harness module ``path`` imports (``from pkg import sub`` is the submodule)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name == "harness" or name.startswith("harness."):
                target = _resolve(name, known)
                if target and target != here:
                    found.add(target)
    return found


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS | {REPORT: 0}
                                           ) else ""


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def problems(edges: dict[str, set[str]]) -> list[str]:
    """Upward imports and report imports, each naming both files."""
    known = modules()
    found = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = layer(source), layer(target)
            where = f"{known[source].relative_to(ROOT)} imports {known[target].relative_to(ROOT)}"
            if a == REPORT and b != REPORT:
                found.append(f"{where}: the report reads files only")
            elif b == REPORT and a not in ("", "plugin", "bisect", REPORT) \
                    and target not in CONTRACT:
                found.append(f"{where}: only the top, the pytest face and the bisect use "
                             "the report")
            elif a != REPORT and b != REPORT and RANKS[a] > RANKS[b]:
                found.append(f"{where}: an upward import ({a or 'harness'} is below "
                             f"{b or 'harness'})")
            elif a in FAMILIES and b in FAMILIES and a != b \
                    and not (b == "invariance" and (target in SWITCH_SHARED
                                                    or target.startswith(STANDINS))):
                found.append(f"{where}: a family imports a sibling family (the families "
                             f"share only {', '.join(SWITCH_SHARED)})")
            elif {a, b} in [set(pair) for pair in APART]:
                found.append(f"{where}: {a} and {b} stand apart (the bisect and the "
                             "reproducer work from outside pytest, the pytest face inside "
                             "it): neither imports the other")
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the chain of modules."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                loop = stack[stack.index(nxt):] + [nxt]
                if frozenset(loop) not in seen:
                    seen.add(frozenset(loop))
                    found.append(loop)
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_imports_go_one_way() -> None:
    assert problems(graph()) == []


def test_there_is_no_import_circle() -> None:
    assert circles(graph()) == []


def upstream_subclasses(path: Path) -> list[str]:
    """The classes ``path`` defines on an upstream's class (a base imported from one of
    ``UPSTREAMS``, at any depth of the module)."""
    tree = ast.parse(path.read_text(), str(path))
    upstream_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UPSTREAMS:
            upstream_names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            upstream_names.update((alias.asname or alias.name).split(".")[0]
                                  for alias in node.names
                                  if alias.name.split(".")[0] in UPSTREAMS)
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(ast.unparse(base).split(".")[0] in upstream_names for base in node.bases)]


def standins_outside_their_place(paths: dict[str, Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)} defines {', '.join(found)} on an upstream's class: "
            f"a stand-in, which lives in {STANDINS.replace('.', '/')}*.py"
            for name, path in sorted(paths.items())
            if not name.startswith(STANDINS) and (found := upstream_subclasses(path))]


def test_stand_ins_live_beside_the_switch_targets_only() -> None:
    """Issue 69: verl's CPU platform sat in the stack layer, beside the stack's facts."""
    assert standins_outside_their_place(modules()) == []
    assert upstream_subclasses(PACKAGE / "invariance" / "standin_verl.py") == ["PlatformCPU"]


def test_the_stand_in_guard_names_one_out_of_place() -> None:
    """The control: verl's platform put back in the stack layer is named."""
    paths = {**modules(), "harness.stack.verl_platform":
             PACKAGE / "invariance" / "standin_verl.py"}
    assert standins_outside_their_place(paths) == [
        "harness/invariance/standin_verl.py defines PlatformCPU on an upstream's class: a "
        "stand-in, which lives in harness/invariance/standin*.py"]


#: the one module of the package that sends signals (``os.kill``, ``os.killpg``): every
#: child, rank, server and trial is ended, and asked for its stacks, through it
KILL_PATH = "harness.isolation.reaper"
#: signals sent elsewhere in the package on purpose, each named with why (a negative control
#: that kills a child deliberately); none today: the tests' controls are outside the package
DELIBERATE_SIGNALS: dict[str, str] = {}


def signal_calls(path: Path) -> list[str]:
    """``os.kill``/``os.killpg`` calls in ``path`` (also through ``from os import kill``)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {alias.asname or alias.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module == "os"
               for alias in node.names if alias.name in ("kill", "killpg")}
    where = path.relative_to(ROOT) if ROOT in path.parents else path.name
    return [f"{where}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and (ast.unparse(node.func) in ("os.kill", "os.killpg")
                 or (isinstance(node.func, ast.Name) and node.func.id in aliases))]


def kills_outside_the_reaper(paths: dict[str, Path]) -> list[str]:
    return [call for name, path in sorted(paths.items()) if name != KILL_PATH
            for call in signal_calls(path) if call not in DELIBERATE_SIGNALS]


def test_one_kill_path() -> None:
    """Issue 69: the child's own group ending and the patch guard's spawned process went
    around the reaper; the package sends no signal elsewhere."""
    assert kills_outside_the_reaper(modules()) == []
    assert signal_calls(PACKAGE / "isolation" / "reaper.py")  # the guard sees os.kill


def test_the_kill_path_guard_names_a_kill_elsewhere(tmp_path: Path) -> None:
    """The control: a module that ends a process by ``os.killpg`` is named, line and all."""
    rogue = tmp_path / "rogue.py"
    rogue.write_text("import os\nimport signal\nfrom os import kill as end_it\n\n\n"
                     "def end(pid):\n    os.killpg(pid, signal.SIGKILL)\n"
                     "    end_it(pid, signal.SIGTERM)\n")
    paths = {**modules(), "harness.isolation.rogue": rogue}
    assert kills_outside_the_reaper(paths) == ["rogue.py:7", "rogue.py:8"]


def test_the_bisect_and_the_report_load_no_pytest_plugin() -> None:
    """Importing the bisect or the report (a command line, a report job) loads nothing of
    the pytest face: no plugin, no session's exit handler."""
    import subprocess
    import sys

    code = ("import sys, harness.bisect.command, harness.repro.command, "
            "harness.report.render, harness.report.bisect_outcomes; "
            "print(sorted(m for m in sys.modules if m.startswith('harness.plugin')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_top_level_holds_only_the_layer_packages_and_three_modules() -> None:
    top = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert top == TOP_MODULES
    assert packages == set(RANKS) - {""} | {REPORT}
    for package in packages:  # each says its job and what it may import
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
        assert doc, f"harness/{package}/__init__.py has no docstring"


def test_the_guard_names_an_upward_import_and_a_circle() -> None:
    """Negative controls: a stack module that imports the plugin, and two modules that
    import each other, are each named."""
    edges = graph()
    edges["harness.stack.devices"] = edges["harness.stack.devices"] | {"harness.plugin"}
    assert problems(edges) == ["harness/stack/devices.py imports harness/plugin/__init__.py: "
                               "an upward import (stack is below plugin)"]
    edges = graph()
    edges["harness.isolation.reaper"] = edges["harness.isolation.reaper"] | {
        "harness.isolation.run"}
    assert ["harness.isolation.reaper", "harness.isolation.run", "harness.isolation.reaper"] \
        in [loop[-3:] for loop in circles(edges)] or any(
        set(loop) >= {"harness.isolation.reaper", "harness.isolation.run"}
        for loop in circles(edges))
    edges = graph()
    edges["harness.logprobs.cases"] = edges["harness.logprobs.cases"] | {
        "harness.collectives.case", "harness.invariance.adapters"}
    assert problems(edges) == [
        f"harness/logprobs/cases.py imports harness/{m}.py: a family imports a sibling "
        "family (the families share only harness.invariance, harness.invariance.standin)"
        for m in ("collectives/case", "invariance/adapters")]
    edges = graph()
    edges["harness.bisect.trial"] = edges["harness.bisect.trial"] | {"harness.plugin.verdicts"}
    assert problems(edges) == ["harness/bisect/trial.py imports harness/plugin/verdicts.py: "
                               "bisect and plugin stand apart (the bisect and the reproducer "
                               "work from outside pytest, the pytest face inside it): neither "
                               "imports the other"]
    edges = graph()
    edges["harness.report.load"] = edges["harness.report.load"] | {"harness.stack.upstream"}
    assert problems(edges) == ["harness/report/load.py imports harness/stack/upstream.py: "
                               "the report reads files only"]


# --- the public contract, imported from where the README and the issues put it ---------

PUBLIC = [
    ("harness", "run_isolated"), ("harness", "count_events"), ("harness", "IsolatedResult"),
    ("harness", "IsolationError"), ("harness", "ChildError"), ("harness", "ChildCrashed"),
    ("harness", "ChildTimeout"), ("harness", "device"), ("harness", "device_kind"),
    ("harness.isolation.run", "isolate"), ("harness.plugin", "SESSION_KEY"),
    ("harness.plugin", "run_on_npu"), ("harness.plugin", "npu_versions"),
    ("harness.hardware", "NpuSpoof"), ("harness.hardware", "NpuVersions"),
    ("harness.hardware", "AscendHardwareVersion"), ("harness.hardware", "get_npu_versions"),
    ("harness.hardware", "ipc_support"), ("harness.hardware.conformance", "complete_spoof"),
    ("harness.hardware.preflight", "STATED_CANN"),
    ("harness.patches", "DeclaredPatch"), ("harness.patches", "Behaviour"),
    ("harness.invariance", "InvarianceTarget"), ("harness.invariance", "get_target"),
    ("harness.logprobs", "check_decode_matches_prefill"),
    ("harness.logprobs", "check_repeatable"), ("harness.logprobs", "TinyDecoder"),
    ("harness.invariance.standin", "stand_in_native_names"), ("harness.cli", "main"),
]


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[f"{m}.{n}" for m, n in PUBLIC])
def test_every_public_name_imports_from_where_it_is_documented(module: str, name: str) -> None:
    import importlib

    assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
