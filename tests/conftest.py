"""The harness's own tests.

torch is imported here, once, before any pytester run: an inline pytester run restores
``sys.modules`` afterwards, and a torch first imported inside one inline run would be
dropped and imported a second time by the next, which corrupts the process (C extensions
cannot be re-initialised).
"""

import torch  # noqa: F401
