"""Settings for the whole suite.

Everything the tests generate in this process is also checked to be a fixed point of
black: production skips that second formatting pass (see s2sgrad/codegen/guard.py).
"""

from functools import partial

import s2sgrad.codegen as codegen
from s2sgrad.codegen.guard import check_generated

codegen.check_generated = partial(check_generated, fixed_point=True)
