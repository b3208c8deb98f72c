"""s2sgrad: a source-to-source differentiator for closure-style PyTorch gradient rules."""

from s2sgrad.diagnostics import Diagnostic, TransformError

__version__ = "0.1.0"

__all__ = ["Diagnostic", "TransformError", "__version__"]
