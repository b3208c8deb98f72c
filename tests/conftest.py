"""Settings for the whole suite.

Everything the tests generate in this process is also checked to be a fixed point of
black: production skips that second formatting pass (see s2sgrad/codegen/guard.py).
"""

from functools import partial

import s2sgrad.codegen as codegen
from s2sgrad.codegen.guard import check_generated

codegen.check_generated = partial(check_generated, fixed_point=True)

# One inductor cache for every test process (xdist workers included) and every run:
# torch.compile's first compile of a graph costs seconds, a cache hit milliseconds.
# It lives outside the repository, so nothing generated is ever committed.
import os  # noqa: E402
import tempfile  # noqa: E402

os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), "s2sgrad-inductor")
)
