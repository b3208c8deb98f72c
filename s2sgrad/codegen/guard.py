"""Check generated code before anyone sees it (black's safe mode, for s2sgrad).

Takes the formatted text of a generated module; returns nothing or raises
`GeneratedCodeError`. The text must compile and define or import every name it reads:
checks that cost little next to generating it. That it is a fixed point of black in the
pinned mode costs a second formatting pass, as long as the first: the tests ask for it
(`fixed_point=True`, tests/conftest.py) on everything they generate, production does not. A failure here is a bug in s2sgrad, never
the user's, so it is not a `TransformError`: the CLI reports it as an internal error and
writes nothing.
"""

from __future__ import annotations

import builtins
import symtable

from s2sgrad.codegen.fmt import format_whole


class GeneratedCodeError(AssertionError):
    """The generated module failed a guard: a bug in s2sgrad."""


def check_generated(text: str, line_length: int, fixed_point: bool = False) -> None:
    """Raise `GeneratedCodeError` unless `text` is a sound generated module."""
    try:
        compile(text, "<generated>", "exec")
    except SyntaxError as exc:
        raise GeneratedCodeError(f"generated code does not compile: {exc}") from exc
    if fixed_point and format_whole(text, line_length) != text:
        raise GeneratedCodeError("generated code is not stable under black")
    undefined = sorted(_undefined_names(text))
    if undefined:
        raise GeneratedCodeError(
            f"generated code reads undefined names: {', '.join(undefined)}"
        )


def _undefined_names(text: str) -> set[str]:
    """Names read as globals that the module neither binds nor gets from builtins."""
    module = symtable.symtable(text, "<generated>", "exec")
    bound = {
        s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported()
    }
    missing: set[str] = set()
    tables = [module]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        for symbol in table.get_symbols():
            name = symbol.get_name()
            global_read = symbol.is_referenced() and (
                symbol.is_global() or table.get_type() == "module"
            )
            if global_read and name not in bound and not hasattr(builtins, name):
                missing.add(name)
    return missing
