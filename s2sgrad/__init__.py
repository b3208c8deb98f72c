"""s2sgrad: a source-to-source differentiator for closure-style PyTorch gradient rules.

The in-process API: `transform` maps source text to the text of the generated module,
exactly as `s2sgrad convert` writes it; `install_import_hook` and `load` serve that
module at import time (see docs/hook.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from s2sgrad.diagnostics import Diagnostic, TransformError
    from s2sgrad.hook import (
        StaleGeneratedCodeWarning,
        TransformImportError,
        install_import_hook,
        load,
    )
    from s2sgrad.options import Options

__version__ = "0.1.0"

__all__ = [
    "Diagnostic",
    "Options",
    "StaleGeneratedCodeWarning",
    "TransformError",
    "TransformImportError",
    "__version__",
    "install_import_hook",
    "load",
    "transform",
]

#: Where each public name lives: imported on first use, so that `import
#: s2sgrad.runtime` (what generated modules import) loads nothing else of s2sgrad.
_LAZY = {
    "Diagnostic": "s2sgrad.diagnostics",
    "TransformError": "s2sgrad.diagnostics",
    "StaleGeneratedCodeWarning": "s2sgrad.hook",
    "TransformImportError": "s2sgrad.hook",
    "install_import_hook": "s2sgrad.hook",
    "load": "s2sgrad.hook",
    "Options": "s2sgrad.options",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 's2sgrad' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def transform(
    source: str,
    filename: str = "<string>",
    module_name: str | None = None,
    **options: Any,
) -> str:
    """Return the generated module for `source`; raise `TransformError` on bad input.

    `filename` is shown in the header and in diagnostics; `module_name` is the importable
    name of the source module, needed only when its differentiators use module-level
    helpers or constants. Keyword options are the fields of `Options`.
    """
    from s2sgrad.header import Origin
    from s2sgrad.options import Options
    from s2sgrad.pipeline import (
        convert,  # the engine (libcst, black) loads on first use
    )

    return convert(source, Origin(filename, module_name), Options(**options))
