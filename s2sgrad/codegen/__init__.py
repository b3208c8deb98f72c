"""Codegen: lifted differentiators to the text of a generated module.

Takes the parsed module, its lifted differentiators and an `Origin` (where the source
lives, by display path and importable name); returns black-formatted module text. The
text is a pure function of those inputs: no timestamps, absolute paths or set order.
"""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from s2sgrad.autodiff.inline import names_read
from s2sgrad.codegen import types
from s2sgrad.codegen.emit import emit
from s2sgrad.codegen.fmt import format_code
from s2sgrad.codegen.function import SAVE_HELPERS, uses_save_helpers
from s2sgrad.codegen.guard import check_generated
from s2sgrad.codegen.imports import import_block
from s2sgrad.cst import module
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.model import Differentiator, ParsedModule
from s2sgrad.header import Origin, header
from s2sgrad.lift import Lifted
from s2sgrad.lines import split_lines
from s2sgrad.names import Names
from s2sgrad.options import Options
from s2sgrad.values import param_value

_ACCUMULATE = '''
def _accumulate(total: Grad, grad: Grad) -> Grad:
    """Add gradients where None stands for zero."""
    return total if grad is None else grad if total is None else total + grad
'''.lstrip()

#: With list parameters, a gradient may be a list: it is added element by element.
_ACCUMULATE_LISTS = '''
def _accumulate(total: Any, grad: Any) -> Any:
    """Add gradients where None is a gradient known to be zero; lists element-wise."""
    if grad is None:
        return total
    if total is None:
        return grad
    if isinstance(total, (list, tuple)):
        return [_accumulate(t, g) for t, g in zip(total, grad, strict=True)]
    return total + grad
'''.lstrip()

#: `Function.apply` binds `inspect.signature(forward)` on every call, which costs more
#: than a small op; outside torch.func transforms and torch.compile its C++ base does
#: the same work without it. Private torch API, so it falls back to `apply` when any
#: piece is gone.
_APPLY = '''
try:  # private torch API: Function.apply without its per-call signature binding
    from torch._C import _are_functorch_transforms_active as _transforms_active
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap

    _base_apply: Any = torch._C._FunctionBase.__dict__["apply"]
except (ImportError, AttributeError, KeyError):  # another torch: Function.apply as is
    _base_apply = None


def _apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """`function.apply(*args)`, without the signature binding where that is safe."""
    if _base_apply is None or _transforms_active() or torch.compiler.is_compiling():
        return function.apply(*args)  # type: ignore[no-untyped-call]
    return _base_apply.__get__(None, function)(*_unwrap(args))
'''.lstrip()


def generate(
    parsed: ParsedModule, lifted: list[Lifted], options: Options, origin: Origin
) -> str:
    """Return the generated module for `lifted`, formatted with black."""
    _check_collisions(parsed, lifted)
    siblings = {item.source.name for item in lifted}
    used = [n for item in lifted for n in item.source.globals_used if n not in siblings]
    body: list[cst.BaseStatement] = list(cst.parse_module(_APPLY).body)
    if any(item.gradients and item.gradients.blocks for item in lifted):
        lists = any(
            param_value(p).tensor_list for item in lifted for p in item.source.params
        )
        body.append(cst.parse_statement(_ACCUMULATE_LISTS if lists else _ACCUMULATE))
    if any(uses_save_helpers(item) for item in lifted):
        body += cst.parse_module(SAVE_HELPERS.lstrip()).body
    taken = set(parsed.module_names) | {
        name for item in lifted for name in vars(Names.of(item.source.name)).values()
    }
    for item in lifted:
        body += emit(item, origin.display_path, siblings, taken, options.line_length)
    code = module(body).code
    aliases, read = _aliases(code)
    imports = _imports(parsed, lifted, origin, used, read)
    code = aliases + "\n\n" + code
    formatted = format_code("\n".join(imports) + "\n" + code, options.line_length)
    text = (
        header(origin.display_path, parsed.source, options.key(), formatted) + formatted
    )
    check_generated(text, options.line_length)
    return text


def _aliases(code: str) -> tuple[str, set[str]]:
    """The type aliases (types.ALIASES) that the module's code uses, defined; and every
    name the code (aliases included) reads. Read with `ast`: a libcst visit of the
    whole generated module would cost more than generating it."""
    read = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    lines = [
        f"{name} = {meaning}  # {note}\n"
        for name, (meaning, note) in types.ALIASES.items()
        if name in read
    ]
    aliases = "".join(lines)
    return aliases, read | {
        n.id for n in ast.walk(ast.parse(aliases)) if isinstance(n, ast.Name)
    }


def _imports(
    parsed: ParsedModule,
    lifted: list[Lifted],
    origin: Origin,
    used: list[str],
    read: set[str],
) -> list[str]:
    """The import lines: what the differentiators use, and what generated code reads."""
    extra = ["from typing import Any, cast"]
    if types.TENSOR in read:
        extra.append(f"from torch import {types.TENSOR}")
    if any(item.once_differentiable for item in lifted):
        extra.append("from torch.autograd.function import once_differentiable")
    if "math" not in used and any(_rules_read_math(item) for item in lifted):
        extra.append("import math")
    try:
        imports = import_block(
            used, parsed.globals, origin.module_name, extra, _postponed(parsed)
        )
    except ValueError:
        first = lifted[0].source
        raise TransformError(
            [
                Diagnostic(
                    "S2S115",
                    "the differentiators use module-level helpers, but "
                    f"{origin.display_path} is not importable as a module",
                    origin.display_path,
                    first.first_line,
                    1,
                    "",
                    "convert a file on disk, inside a package or on sys.path",
                ),
            ]
        ) from None
    return imports


def _postponed(parsed: ParsedModule) -> bool:
    """Tell whether the source says `from __future__ import annotations`."""
    future = m.ImportFrom(
        module=m.Name("__future__"),
        names=[m.ZeroOrMore(), m.ImportAlias(m.Name("annotations")), m.ZeroOrMore()],
    )
    return any(
        m.matches(
            statement,
            m.SimpleStatementLine(body=[m.ZeroOrMore(), future, m.ZeroOrMore()]),
        )
        for statement in parsed.module.body
    )


def _rules_read_math(item: Lifted) -> bool:
    """Tell whether inlined derivative rules use `math` (rules may read torch and math)."""
    blocks = item.gradients.blocks if item.gradients else ()
    return any("math" in names_read(block) for block in blocks)


def _only_called(diff: Differentiator, name: str) -> bool:
    """Tell whether every use of `name` in `diff` is a call `name(...)`."""
    calls = m.findall(diff.forward, m.Call(func=m.Name(name)))
    uses = m.findall(diff.forward, m.Name(name))
    return len(calls) == len(uses)


#: Module-level names the generated module may define or import for itself.
_OWN_NAMES = (
    "_apply",
    "_base_apply",
    "_transforms_active",
    "_unwrap",
    "_accumulate",
    "_save",
    "_saved",
    *types.ALIASES,
)

#: Names the generated module imports: the same objects are no collision.
_IMPORTED = {
    "Any": "from typing import Any",
    "cast": "from typing import cast",
    types.TENSOR: f"from torch import {types.TENSOR}",
    "once_differentiable": "from torch.autograd.function import once_differentiable",
}


def _check_collisions(parsed: ParsedModule, lifted: list[Lifted]) -> None:
    generated = dict.fromkeys(_OWN_NAMES, "its own use")
    for name, statement in _IMPORTED.items():
        spec = parsed.globals.get(name)
        if spec is not None and spec.import_code != statement:
            generated[name] = "its own use"
    for item in lifted:
        names = Names.of(item.source.name)
        for name in (names.forward, names.backward, names.function, names.op):
            generated[name] = f"`{item.source.name}`"
    found = []
    for item in lifted:
        diff = item.source
        siblings = {other.source.name for other in lifted}
        for name in diff.globals_used:
            calls_sibling = name in siblings and _only_called(diff, name)
            if name in generated and name in parsed.globals and not calls_sibling:
                found.append(
                    Diagnostic(
                        "S2S114",
                        f"`{diff.name}` uses the module-level name `{name}`, which the "
                        f"generated module defines for {generated[name]}",
                        parsed.path,
                        diff.first_line,
                        1,
                        split_lines(parsed.source)[diff.first_line - 1],
                        "rename the helper, or call the other differentiator's op from a "
                        "plain helper function",
                    )
                )
    if found:
        raise TransformError(found)
