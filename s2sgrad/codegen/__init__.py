"""Codegen: differentiated records to the text of a generated module.

Takes the parsed module, its differentiated records and an `Origin` (where the source
lives, by display path and importable name); returns black-formatted module text. The
text is a pure function of those inputs: no timestamps, absolute paths or set order.
"""

from __future__ import annotations

import ast
import re
import symtable
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.inline import names_read
from s2sgrad.autodiff.record import Differentiated
from s2sgrad.codegen import types
from s2sgrad.codegen.emit import emit
from s2sgrad.codegen.fmt import cut, definition_starts, format_pieces, pieces
from s2sgrad.codegen.guard import check_generated
from s2sgrad.codegen.imports import import_block, importable, name_key
from s2sgrad.codegen.standalone import runtime
from s2sgrad.cst import (
    as_compound_or_line,
    bound,
    calls_name,
    findall,
    is_name,
    module,
    nodes,
)
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.model import Differentiator, ParsedModule
from s2sgrad.header import FORMAT_VERSION, Origin, header
from s2sgrad.lines import split_lines
from s2sgrad.names import Names
from s2sgrad.options import Compile, Options
from s2sgrad.values import SETITEM_NAME


def _closures_called(sources: Sequence[Differentiator], siblings: set[str]) -> set[str]:
    """The differentiators whose closure another one's backward calls, `g(x)[1](grad)`
    (as written, or as `u, g_bwd = g(x)` in forward becomes)."""
    found: set[str] = set()
    for diff in sources:
        for node in nodes(diff.backward.body):
            if (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Subscript)
                and isinstance(node.func.value, cst.Call)
                and isinstance(node.func.value.func, cst.Name)
                and node.func.value.func.value in siblings
            ):
                found.add(node.func.value.func.value)
    return found


def generate(
    parsed: ParsedModule,
    records: list[Differentiated],
    options: Options,
    origin: Origin,
) -> str:
    """Return the generated module for `records`, formatted with black."""
    sources = [item.source for item in records]
    check_collisions(parsed, sources)
    layout = plan(parsed, sources, options, origin.display_path)
    return assemble(parsed, sources, [part(layout, records)], options, origin)


@dataclass(frozen=True)
class Layout:
    """What the code of each differentiator needs to know of its whole module: the
    code of a run of differentiators (`part`) is then the same wherever it is made."""

    path: str
    line_length: int
    siblings: frozenset[str]
    #: Names the module and the generated definitions take.
    taken: frozenset[str]
    compiled: Mapping[str, Compile]
    #: Module constants that are literals.
    literals: frozenset[str]
    #: The differentiators whose closure another one's backward calls.
    called: frozenset[str]


def plan(
    parsed: ParsedModule,
    sources: Sequence[Differentiator],
    options: Options,
    path: str,
) -> Layout:
    """The `Layout` of a module whose differentiators are `sources`."""
    siblings = {diff.name for diff in sources}
    taken = set(parsed.module_names) | {
        name for diff in sources for name in vars(Names.of(diff.name)).values()
    }
    return Layout(
        path,
        options.line_length,
        frozenset(siblings),
        frozenset(taken),
        {diff.name: _compiles(diff, options) for diff in sources},
        frozenset(n for n, e in parsed.constants.items() if _literal(e)),
        frozenset(_closures_called(sources, siblings)),
    )


@dataclass(frozen=True)
class Part:
    """The generated code of a run of differentiators, formatted: black's text of
    each top-level definition (with what follows it up to the next), the names the
    code reads, and whether inlined rules read `math`."""

    pieces: tuple[str, ...]
    read: frozenset[str]
    math: bool


def part(layout: Layout, records: Sequence[Differentiated]) -> Part:
    """The code of `records`, a run of a module's differentiators in source order."""
    body: list[cst.BaseStatement | str] = []
    for item in records:
        name = item.source.name
        body += emit(
            item,
            layout.path,
            layout.siblings,
            layout.taken,
            layout.line_length,
            layout.compiled[name],
            layout.literals,
            name in layout.called,
        )
    code, starts = _rendered(body)
    return Part(
        format_pieces(pieces(cut(code, starts)), layout.line_length),
        frozenset(_names_read(code) - _only_local(code)),
        any(_rules_read_math(item) for item in records),
    )


#: mypy's inline configuration, where the generated code calls a function without
#: annotations (the user's helper, or one of torch's few, `Tensor.split`): mypy
#: --strict refuses such a call in typed code, and the code is not s2sgrad's to type.
_UNTYPED_CALLS = '# mypy: disable-error-code="no-untyped-call"'
_IGNORED_UNTYPED = "  # type: ignore[no-untyped-call]"
#: torch's Tensor methods that torch leaves without annotations (torch 2.13).
_UNTYPED_METHOD = re.compile(r"\.(split|unique|unique_consecutive|unflatten|lu)\(")


def _calls_untyped(parsed: ParsedModule, used: set[str], parts: Sequence[Part]) -> bool:
    """Whether the generated code calls a helper of the source module that has no
    annotation at all (what mypy calls untyped), or an untyped Tensor method."""
    for name in used:
        helper = parsed.helpers.get(name)
        if helper is not None and _untyped(helper.node):
            return True
    return any(_UNTYPED_METHOD.search(piece) for p in parts for piece in p.pieces)


def _untyped(function: cst.FunctionDef) -> bool:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [
        p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)
    ]
    return function.returns is None and all(p.annotation is None for p in every)


def assemble(
    parsed: ParsedModule,
    sources: Sequence[Differentiator],
    parts: Sequence[Part],
    options: Options,
    origin: Origin,
) -> str:
    """The module: its imports, the runtime's check or copy, then the code of
    `parts` (in source order), under the header."""
    siblings = {diff.name for diff in sources}
    used = [n for diff in sources for n in diff.globals_used if n not in siblings]
    read = set().union(*(p.read for p in parts))
    wanted = read & runtime().names
    untyped = _calls_untyped(parsed, set(used) & read, parts)
    if options.standalone:
        runtime_imports, runtime_code = runtime().copy(wanted)
        if untyped:
            # The module's inline configuration turns the error off, so the
            # runtime's own ignores of it would be unused, which --strict reports.
            runtime_code = runtime_code.replace(_IGNORED_UNTYPED, "")
        before = f"{_STANDALONE}\n\n\n{runtime_code}\n\n\n"
        read |= _names_read(runtime_code)
    else:
        names = ", ".join(sorted(wanted | {"_serves"}, key=name_key))
        runtime_imports = [f"from s2sgrad.runtime import {names}"]
        check = f"_serves({FORMAT_VERSION}, __name__)  # {_FORMAT_NOTE}"
        before = f"{check}\n\n\n"
    math = any(p.math for p in parts)
    imports = _imports(parsed, sources, origin, used, read, runtime_imports, math)
    if untyped:
        imports = [_UNTYPED_CALLS, *imports]
    head = "\n".join(imports) + "\n\n" + before
    # The head (imports, the runtime's copy) is cut where `ast` finds its
    # definitions; the parts were cut where they were written.
    head_pieces = format_pieces(
        pieces(cut(head, definition_starts(head))), options.line_length
    )
    formatted = "\n\n".join([*head_pieces, *(p for x in parts for p in x.pieces)])
    top = header(
        origin.display_path, parsed.source, options.key(), formatted, origin.module_name
    )
    text = top + formatted
    check_generated(text, options.line_length)
    return text


def _rendered(body: list[cst.BaseStatement | str]) -> tuple[str, list[int]]:
    """The code of `body` (what its module's `.code` is) and the line indices in it
    where its top-level definitions start (a decorated one's at its first decorator):
    each statement is rendered on its own, so where one starts is known without
    parsing the code. A definition emitted as code (the Function class) is taken as
    it is, below its blank lines."""
    tree = module([])
    code: list[str] = []
    starts: list[int] = []
    line = 0
    for statement in body:
        if isinstance(statement, str):
            starts.append(line + len(statement) - len(statement.lstrip("\n")))
            code.append(statement)
            line += statement.count("\n")
            continue
        text = tree.code_for_node(as_compound_or_line(statement))
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            # The lines above its `def` or `class`, or above its first decorator.
            above = [*statement.leading_lines]
            if statement.decorators:
                above += statement.decorators[0].leading_lines
            else:
                above += statement.lines_after_decorators
            starts.append(line + sum(tree.code_for_node(a).count("\n") for a in above))
        code.append(text)
        line += text.count("\n")
    return "".join(code), starts


def _literal(value: cst.BaseExpression) -> bool:
    """Whether a module constant is a literal number, string, bool or None."""
    if isinstance(value, cst.UnaryOperation):
        value = value.expression
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(value, cst.Name) and value.value in ("True", "False", "None")
    )


def _compiles(diff: Differentiator, options: Options) -> Compile:
    """Whether the differentiator runs compiled (and strictly): its pragma, else the
    option."""
    pragma = diff.pragmas.get("compile")
    if pragma is None:
        return options.compile
    return "strict" if pragma == "strict" else pragma == "true"


def _names_read(code: str) -> set[str]:
    """Every name `code` reads, in string annotations too. Read with `ast` (a libcst
    visit of the whole generated module would cost more than generating it), in one
    walk of the tree: it is as large as the module."""
    names: set[str] = set()
    annotations: list[ast.expr | None] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    return names | _read_in_string_annotations(annotations)


def _only_local(code: str) -> set[str]:
    """The names that every function of `code` using them binds itself, and that
    nothing reads from the module: a parameter named `cast` reads no `typing.cast`,
    which would then be imported unused (ruff F401, an outside probe). Python's own
    scope analysis (`symtable`) says where each name lives."""
    local: set[str] = set()
    module_level: set[str] = set()
    tables = [symtable.symtable(code, "<generated>", "exec")]
    while tables:
        table = tables.pop()
        function = table.get_type() == "function"
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if function and (symbol.is_local() or symbol.is_free()):
                local.add(name)
            elif symbol.is_referenced() or symbol.is_global() or not function:
                module_level.add(name)
        tables += table.get_children()
    return local - module_level


def _read_in_string_annotations(annotations: list[ast.expr | None]) -> set[str]:
    """The names that annotations written as strings read (`xs: "List[Tensor]"`)."""
    found: set[str] = set()
    for annotation in annotations:
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                inner = ast.parse(annotation.value, mode="eval")
            except SyntaxError:
                continue
            found |= {n.id for n in ast.walk(inner) if isinstance(n, ast.Name)}
    return found


def _imports(
    parsed: ParsedModule,
    sources: Sequence[Differentiator],
    origin: Origin,
    used: list[str],
    read: set[str],
    runtime_imports: list[str],
    math: bool,
) -> list[str]:
    """The import lines: what the differentiators use, what generated code reads, and
    the runtime (its names, or, standalone, what the copied parts import)."""
    # Names only the dropped parts read (the closure's return annotation) stay out.
    used = [name for name in used if name in read]
    extra = [*runtime_imports]
    typing = sorted(name for name in ("Any", "cast") if name in read)
    if typing:
        extra.append(f"from typing import {', '.join(typing)}")
    if "torch" in read:
        extra.append("import torch")
    if types.TENSOR in read:
        extra.append(f"from torch import {types.TENSOR}")
    if "math" not in used and math:
        extra.append("import math")
    try:
        imports = import_block(
            used, parsed.globals, origin.module_name, extra, _postponed(parsed)
        )
    except ValueError:
        first = sources[0]
        hint = "convert a file on disk, inside a package or on sys.path"
        if origin.module_name is not None and not importable(origin.module_name):
            hint = (
                f"no import statement can name `{origin.module_name}`: rename the "
                "file and its packages to Python identifiers"
            )
        raise TransformError(
            [
                Diagnostic(
                    "S2S115",
                    "the differentiators use module-level helpers, but "
                    f"{origin.where} is not importable as a module",
                    origin.where,
                    first.first_line,
                    1,
                    "",
                    hint,
                ),
            ]
        ) from None
    return imports


def _postponed(parsed: ParsedModule) -> bool:
    """Tell whether the source says `from __future__ import annotations`."""
    return any(
        _imports_annotations(small)
        for statement in parsed.module.body
        if isinstance(statement, cst.SimpleStatementLine)
        for small in statement.body
    )


def _imports_annotations(node: cst.BaseSmallStatement) -> bool:
    """Whether `node` is `from __future__ import annotations` (among other names;
    the dots of a relative import are not looked at)."""
    return (
        isinstance(node, cst.ImportFrom)
        and is_name(node.module, "__future__")
        and not isinstance(node.names, cst.ImportStar)
        and any(is_name(alias.name, "annotations") for alias in node.names)
    )


def _rules_read_math(item: Differentiated) -> bool:
    """Tell whether inlined derivative rules use `math` (rules may read torch and math)."""
    blocks = item.gradients.blocks if item.gradients else ()
    return any("math" in names_read(block) for block in blocks)


def _only_called(diff: Differentiator, name: str) -> bool:
    """Tell whether every use of `name` in `diff` is a call `name(...)`. An
    attribute (`torch.exp` beside a sibling `exp`) or a keyword spelled so is no
    use of the module-level name."""
    calls = findall(diff.forward, cst.Call, lambda c: calls_name(c, name))
    spelled = {id(n.attr) for n in findall(diff.forward, cst.Attribute)}
    spelled |= {id(a.keyword) for a in findall(diff.forward, cst.Arg)}
    uses = findall(
        diff.forward, cst.Name, lambda n: n.value == name and id(n) not in spelled
    )
    return len(calls) == len(uses)


#: The comment of the format check, and the one above a standalone copy.
_FORMAT_NOTE = "the runtime refuses a format it does not serve"
_STANDALONE = (
    f"# The parts of s2sgrad.runtime (format {FORMAT_VERSION}) that this module uses, "
    "copied\n# (--standalone): it runs where s2sgrad is not installed."
)


#: Module-level names the generated code reads inside the functions that hold the
#: user's code (an accumulation, the op's apply, `math` in inlined rules): a parameter
#: or a local of the same name would hide them.
_SHADOWED = frozenset(
    {
        "_accumulate",
        "_reduce",
        "_apply",
        "_requires_grad",
        "_tangents_follow_grad",
        "_save",
        "_saved",
        SETITEM_NAME,
        "math",
    }
)

#: Names the generated module imports: the same objects are no collision.
_IMPORTED = {
    "Any": "from typing import Any",
    "cast": "from typing import cast",
    types.TENSOR: f"from torch import {types.TENSOR}",
    "functools": "import functools",
    "contextvars": "import contextvars",
    "inspect": "import inspect",
    "warnings": "import warnings",
    "contextlib": "import contextlib",
    "Iterator": "from collections.abc import Iterator",
    "forward_ad": "from torch.autograd import forward_ad",
}


def check_collisions(parsed: ParsedModule, sources: Sequence[Differentiator]) -> None:
    """Raise S2S114 where the generated module's own names would meet the user's."""
    found = collisions(parsed, sources)
    if found:
        raise TransformError(found)


def collisions(
    parsed: ParsedModule, sources: Sequence[Differentiator]
) -> list[Diagnostic]:
    """S2S114 for each name the generated module would define or read for its own
    use where a differentiator binds or reads it."""
    runtime_names = runtime().names | {"_serves"}
    # A name the source imports from the runtime itself is the same object.
    runtime_names -= {
        name
        for name, spec in parsed.globals.items()
        if spec.import_code is not None
        and spec.import_code.startswith("from s2sgrad.runtime import ")
    }
    generated = dict.fromkeys(sorted(runtime_names), "its own use")
    for name, statement in _IMPORTED.items():
        spec = parsed.globals.get(name)
        if spec is not None and spec.import_code != statement:
            generated[name] = "its own use"
    found = []
    owners: dict[str, Differentiator] = {}
    imported = runtime_names | set(_IMPORTED) | {"torch", "math"}
    for diff in sources:
        names = Names.of(diff.name)
        for name in (names.forward, names.backward, names.function, names.op):
            first = owners.setdefault(name, diff)
            if first is not diff:
                found.append(_both_define(parsed, first, diff, name))
            elif name in imported:
                found.append(_imported_too(parsed, diff, name))
            generated[name] = f"`{diff.name}`"
    for diff in sources:
        for param in diff.params:
            owner = owners.get(param.name)
            if owner is not None:
                found.append(_parameter_hides(parsed, diff, param.name, owner))
    siblings = {other.name for other in sources}
    for diff in sources:
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
                        (
                            f"bind it as the generated module does, `{_IMPORTED[name]}`"
                            ", or use another name"
                            if name in _IMPORTED
                            else "rename the helper, or call the other "
                            "differentiator's op from a plain helper function"
                        ),
                    )
                )
    for diff in sources:
        own = (
            bound(diff.forward.body)  # forward's own locals (`_accumulate = ...`)
            | set(diff.backward_locals)
            | {p.name for p in diff.params}
        )
        for name in sorted(own & _SHADOWED):
            text = split_lines(parsed.source)[diff.first_line - 1]
            found.append(
                Diagnostic(
                    "S2S114",
                    f"`{diff.name}` binds `{name}`, a name the generated code reads "
                    "inside its functions for its own use, where this binding would "
                    "hide it",
                    parsed.path,
                    diff.first_line,
                    text.find(diff.name) + 1 or 1,
                    text,
                    f"rename `{name}` in `{diff.name}`",
                )
            )
    return found


def _both_define(
    parsed: ParsedModule, first: Differentiator, diff: Differentiator, name: str
) -> Diagnostic:
    """S2S114: two differentiators whose generated definitions take one name."""
    return _clash(
        parsed,
        diff,
        diff.name,
        f"the generated module would define `{name}` for `{diff.name}` and for "
        f"`{first.name}` (line {first.first_line}): one would replace the other",
        f"rename `{diff.name}` or `{first.name}`",
    )


def _imported_too(parsed: ParsedModule, diff: Differentiator, name: str) -> Diagnostic:
    """S2S114: a differentiator whose generated definition takes the name of what the
    generated module imports for its own use (an op `cast` replaced `typing.cast`,
    which every op's body calls)."""
    return _clash(
        parsed,
        diff,
        diff.name,
        f"the generated module imports `{name}` for its own use, and would define "
        f"`{name}` for `{diff.name}` too: the definition would replace the import",
        f"rename `{diff.name}`",
    )


def _parameter_hides(
    parsed: ParsedModule, diff: Differentiator, name: str, owner: Differentiator
) -> Diagnostic:
    """S2S114: a parameter named like a generated definition, which it would hide
    inside the generated functions that take it."""
    return _clash(
        parsed,
        diff,
        name,
        f"`{diff.name}` has a parameter `{name}`, the name of the generated "
        f"definition for `{owner.name}`, which the parameter would hide",
        f"rename the parameter `{name}`",
    )


def _clash(
    parsed: ParsedModule, diff: Differentiator, at: str, message: str, hint: str
) -> Diagnostic:
    """S2S114 on `diff`'s `def` line, at the first `at` in it."""
    text = split_lines(parsed.source)[diff.first_line - 1]
    column = text.find(at) + 1 or 1
    return Diagnostic(
        "S2S114", message, parsed.path, diff.first_line, column, text, hint
    )
