"""verl's batch-invariance switch, turned by verl's own code (child side).

verl users never set VLLM_BATCH_INVARIANT: they set the rollout option
``actor_rollout_ref.rollout.full_determinism``, and verl's ``run_ppo``
(``verl/trainer/main_ppo.py``) sets the variable in the driver and forwards it, through the
Ray runtime env of ``get_ppo_ray_runtime_env``, to every Ray actor, where verl's vLLM
engines run. ``turn_switch`` does exactly that: it loads verl's own generated PPO config,
sets the option, and calls ``run_ppo`` on a local one-CPU Ray with a probe actor in place
of verl's task runner (the trainer itself needs a model, data and devices). The probe
reports the environment a verl worker sees; the driver's environment is what the
vllm-ascend init that follows reads.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.invariance.target import SWITCH_ENV
from harness.stack.upstream import UpstreamApiMoved, release, require, source_file

#: verl's own PPO config (the one its hydra entry point composes)
CONFIG_PACKAGE = "verl.trainer.config"
CONFIG_FILE = "_generated_ppo_trainer.yaml"
#: verl's PPO entry module, and what the harness relies on in it; a missing one is an
#: upstream API that moved
MAIN_PPO = "verl.trainer.main_ppo"
MAIN_PPO_SYMBOLS = ("run_ppo",)
OPTION = "actor_rollout_ref.rollout.full_determinism"
#: the variables verl's determinism switch touches, as a worker sees them
WORKER_VARIABLES = (SWITCH_ENV, "VERL_FULL_DETERMINISM", "PYTHONHASHSEED")


def ppo_config(full_determinism: bool) -> Any:
    """verl's generated PPO trainer config with the rollout switch set, on one CPU."""
    from omegaconf import OmegaConf

    package = source_file(CONFIG_PACKAGE)
    yaml_path = package.parent / CONFIG_FILE if package else None
    if yaml_path is None or not yaml_path.is_file():
        raise UpstreamApiMoved(f"upstream API moved: {release('verl')} has no {CONFIG_FILE} in "
                            f"{package.parent if package else CONFIG_PACKAGE}")
    config = OmegaConf.load(yaml_path)
    if OmegaConf.select(config, OPTION) is None:
        raise UpstreamApiMoved(f"upstream API moved: {release('verl')}'s PPO config has no "
                               f"{OPTION}")
    OmegaConf.update(config, OPTION, full_determinism)
    # a CI runner's Ray: one CPU, no dashboard (options users pass the same way)
    OmegaConf.update(config, "ray_kwargs.ray_init.num_cpus", 1, force_add=True)
    OmegaConf.update(config, "ray_kwargs.ray_init.include_dashboard", False, force_add=True)
    return config


def _probe_runner(report: Path) -> Any:
    """A Ray actor class with the task runner's interface (``run(config)``) that writes the
    environment it was started with to ``report``."""
    import ray

    @ray.remote(num_cpus=0)
    class EnvironmentProbe:
        def run(self, config: Any) -> None:
            report.write_text(json.dumps({k: os.environ.get(k) for k in WORKER_VARIABLES}))

    return EnvironmentProbe


def load() -> Any:
    """Import verl's ``main_ppo`` (before the CPU stand-in device exists: verl decides at import
    whether torch_npu is usable, and on a machine without an NPU it must see none)."""
    import importlib

    main_ppo = importlib.import_module(MAIN_PPO)
    require(main_ppo, "verl", MAIN_PPO_SYMBOLS)
    return main_ppo


def turn_switch(full_determinism: bool) -> dict[str, str | None]:
    """Run verl's ``run_ppo`` with the rollout switch set; return the switch variables a Ray
    actor started by it saw. The driver's own VLLM_BATCH_INVARIANT is left as verl set it
    (an inherited value is removed first: only verl may set it)."""
    import ray

    os.environ.pop(SWITCH_ENV, None)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main_ppo = load()
    with tempfile.TemporaryDirectory(prefix="npu-regress-verl-") as tmp:
        report = Path(tmp) / "worker-env.json"
        try:
            main_ppo.run_ppo(ppo_config(full_determinism), _probe_runner(report))
        finally:
            ray.shutdown()
        if not report.is_file():
            raise AssertionError("verl's run_ppo returned without running its task runner")
        seen: dict[str, str | None] = json.loads(report.read_text())
    return seen
