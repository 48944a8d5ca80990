"""``python -m harness report ...``"""

import sys

from harness.cli import main

sys.exit(main())
