"""Frontend: source text to checked `Differentiator` records (see `parse`)."""

from s2sgrad.frontend.model import Capture, Differentiator, Param, ParsedModule, Use
from s2sgrad.frontend.parse import parse
from s2sgrad.sources import decode_source

__all__ = [
    "Capture",
    "Differentiator",
    "Param",
    "ParsedModule",
    "Use",
    "decode_source",
    "parse",
]
