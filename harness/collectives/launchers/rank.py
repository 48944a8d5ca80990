"""One rank under torchrun's elastic agent: the agent set ``RANK``, ``LOCAL_RANK``,
``GROUP_RANK`` (the node's rank), ``WORLD_SIZE`` and the rendezvous store; the rank applies
the job's environment, starts its group from them (``env://``) and returns its value with
where it ran. A raised error goes back through the agent (its error file); the time it
raised is kept in the node's folder, so the first rank to raise is named the cause."""

from __future__ import annotations

import os
import pickle
import time
import traceback
from pathlib import Path
from typing import Any


def main(job_file: str, folder: str) -> dict[str, Any]:
    import cloudpickle

    from harness.collectives import ranks
    from harness.isolation.child import die_with_parent

    die_with_parent()  # with its agent: a node's agent ended ends its ranks
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = Path(folder)
    stack_file = ranks.arm_stack(out, rank, local)
    job = cloudpickle.loads(Path(job_file).read_bytes())
    seen = ranks.apply_env(job["env"])
    (out / f"rank{rank}.ready").touch()
    try:
        # the group outlasts the check's time: the node's watchdog names a hang first
        ranks.init_group(job["backend"], local, job["timeout"] + ranks.START_S)
        value = ranks.run_body(job["fn"], rank, world, job["args"],
                               out / f"rank{rank}.failed_at")
    except BaseException as exc:
        # the agent reports one failure a node; every rank's own goes in the node's folder
        failed = out / f"rank{rank}.failed_at"
        if not failed.exists():
            failed.write_text(repr(time.time()))
        (out / f"rank{rank}.error").write_bytes(pickle.dumps(
            (f"{type(exc).__name__}: {exc}", traceback.format_exc())))
        raise
    finally:
        stack_file.close()
    return {"value": value, "env_at_init": seen, "node": ranks.node_id(),
            "node_rank": int(os.environ.get("GROUP_RANK", "0")), "local_rank": local}
