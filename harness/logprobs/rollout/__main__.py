"""``python -m harness.logprobs.rollout``: the engine side (``engine_side.main``)."""

import sys

from harness.logprobs.rollout.engine_side import main

sys.exit(main())
