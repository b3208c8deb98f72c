"""User-facing errors as values.

A `Diagnostic` names a stable code, a message, where in the source it points and, when
one helps, a hint. The engine raises `TransformError` carrying diagnostics; only the
edges (the CLI and the import hook) turn them into text and exit codes. Codes are stable
and documented in docs/errors.md.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Every code s2sgrad reports, with a one-line title. docs/errors.md documents each.
CODES: dict[str, str] = {
    "S2S001": "syntax error",
    "S2S002": "source is not valid UTF-8",
    "S2S003": "no differentiators found",
    "S2S004": "cannot read the source file",
    "S2S101": "return before the end of the forward function",
    "S2S102": "nonlocal or global statement",
    "S2S103": "in-place mutation or deletion of a captured value or an input",
    "S2S104": "generator or async code",
    "S2S105": "backward escapes other than through the final return",
    "S2S106": "backward is not returned",
    "S2S107": "backward arity does not match the outputs",
    "S2S108": "backward returns the wrong number of gradients, or none",
    "S2S109": "lambda used as backward",
    "S2S110": "variadic or keyword-only parameters in backward, or variadic forward",
    "S2S111": "backward is defined more than once",
    "S2S112": "undefined name",
    "S2S113": "decorated differentiator or backward",
    "S2S114": "generated name collides with a name in the source module",
    "S2S115": "helpers used, but the source is not an importable module",
    "S2S116": "backward is defined inside a block instead of directly in forward",
    "S2S117": "name read before it is assigned",
    "S2S118": "source nested too deeply to analyse",
    "S2S119": "differentiator defined more than once",
    "S2S120": "closure of another differentiator used other than called in backward",
    "S2S121": "a value backward recomputes depends on random numbers",
    "S2S122": "unknown pragma or pragma value",
    "S2S123": "in-place change of a differentiable tensor that cannot be rewritten",
    "S2S124": "an output of unknown kind",
    "S2S125": "an unannotated parameter that takes a gradient used as a sequence",
    "S2S126": "forward reads or sets autograd's state",
    "S2S127": "a differentiator with flat outputs called by another",
    "S2S128": "backward reads an output that torch does not differentiate",
    "S2S129": "forward binds values where reverse mode does not follow",
    "S2S130": "a parameter that takes a gradient holds tensors in a container "
    "other than a list or tuple of them",
    "S2S131": "forward changes module-level state that it reads",
    "S2S132": "an identifier Python reads as another spelling",
    "S2S133": "a differentiator defined inside a module-level block",
}


@dataclass(frozen=True)
class Diagnostic:
    """One located user error: `path:line:col: error[code]: message`."""

    code: str
    message: str
    path: str
    line: int
    column: int  # 1-based, as editors and compilers print it
    source_line: str = ""
    hint: str | None = None

    def render(self) -> str:
        """Return the compiler-style text: header, source line, caret, hint."""
        head = (
            f"{self.path}:{self.line}:{self.column}: error[{self.code}]: {self.message}"
        )
        parts = [head]
        if self.source_line:
            text, column = _window(
                _printable(self.source_line.rstrip("\r\n").expandtabs(1)),
                self.column,
            )
            parts.append(f"    {text}")
            parts.append("    " + " " * (column - 1) + "^")
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)


#: Source lines longer than this are shown as a window around the caret.
_MAX_SHOWN = 120


def _window(text: str, column: int) -> tuple[str, int]:
    """Cut a long line to `_MAX_SHOWN` characters around `column`, marked by `...`."""
    if len(text) <= _MAX_SHOWN:
        return text, column
    width = _MAX_SHOWN - 6
    start = max(0, min(column - 1 - width // 2, len(text) - width))
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + width < len(text) else ""
    return prefix + text[start : start + width] + suffix, column - start + len(prefix)


def _printable(text: str) -> str:
    """Replace control characters (form feeds, NULs) by spaces, keeping columns."""
    return "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)


class TransformError(Exception):
    """A user error in the input: carries at least one diagnostic."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("\n".join(d.render() for d in diagnostics))
        self.diagnostics = tuple(diagnostics)

    def __reduce__(self) -> tuple[type[TransformError], tuple[list[Diagnostic]]]:
        # Made again from its diagnostics (a forked process sends it back pickled).
        return (TransformError, (list(self.diagnostics),))
