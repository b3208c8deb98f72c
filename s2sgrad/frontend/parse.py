"""Parse a module and find its differentiators.

Takes source text and a display path; returns a `ParsedModule` whose differentiators
passed every check of the input language, or raises `TransformError` with all the
diagnostics found (every differentiator is checked, so one run reports every problem).
The source is first compiled by Python itself (S2S001 uses Python's messages); the
libcst analysis then costs time in the size of the differentiators, not of the module.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, get_args

import libcst as cst
from libcst.metadata import (
    CodePosition,
    CodeRange,
    GlobalScope,
    PositionProvider,
    Scope,
    ScopeProvider,
)

from s2sgrad.cst import (
    STATEMENT_CLASSES,
    DepthTransformer,
    as_statement,
    calls_name,
    findall,
    is_name,
    nodes,
    walk,
)
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend import checks
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.metadata import Metadata
from s2sgrad.frontend.model import Differentiator, Helper, Param, ParsedModule
from s2sgrad.frontend.scopes import ScopeAnalysis, global_name
from s2sgrad.lines import line_text, split_lines
from s2sgrad.options import Policy

_PRAGMA_START = re.compile(r"#\s*s2sgrad\s*:(.*)$")
_PRAGMA_PAIR = re.compile(r"([A-Za-z_][\w-]*)\s*=\s*([\w.-]+)")
#: Pragma keys and the values each one takes.
PRAGMAS: dict[str, tuple[str, ...]] = {
    "policy": get_args(Policy),
    "compile": ("true", "false", "strict"),
    # backward is meant to differ from forward's derivative (a straight-through
    # estimator, a surrogate gradient): s2sgrad.testing checks the op against it
    "surrogate": ("true", "false"),
}


def check_syntax(source: str, path: str) -> ast.Module:
    """Compile `source` as Python would, and report a syntax error as S2S001.

    libcst accepts some programs CPython rejects (`return` outside a function,
    duplicate parameters, `await` outside `async def`); the generated module imports
    the source module, so whatever CPython rejects is rejected here first, with
    CPython's message. Returns Python's syntax tree (its line numbers are cheap).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(
                source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True
            )
            assert isinstance(tree, ast.Module)
            compile(tree, path, "exec", dont_inherit=True)
            return tree
    except SyntaxError as exc:
        raise TransformError([_syntax_error(exc, source, path)]) from None
    except ValueError:  # null bytes, before Python 3.12
        raise TransformError([_null_byte(source, path)]) from None
    except (RecursionError, MemoryError):
        raise TransformError([too_deep(source, path)]) from None


def _syntax_error(exc: SyntaxError, source: str, path: str) -> Diagnostic:
    if exc.lineno is None:
        return _null_byte(source, path)
    text = line_text(split_lines(source), exc.lineno)
    column = exc.offset or 1
    if exc.text is None:
        # Errors found after parsing (symbol table, compiler) count UTF-8 bytes.
        prefix = text.encode("utf-8")[: column - 1]
        column = len(prefix.decode("utf-8", errors="ignore")) + 1
    kind = "syntax error"
    if isinstance(exc, IndentationError):
        kind = "indentation error"
        column = len(text) - len(text.lstrip(" \t\f")) + 1
    column = max(1, min(column, len(text) + 1))
    return Diagnostic("S2S001", f"{kind}: {exc.msg}", path, exc.lineno, column, text)


def _null_byte(source: str, path: str) -> Diagnostic:
    offset = max(source.find("\0"), 0)
    before = split_lines(source[:offset] + "\n")
    return Diagnostic(
        "S2S001",
        "syntax error: the source contains a null byte",
        path,
        len(before),
        len(before[-1]) + 1,
        line_text(split_lines(source), len(before)),
        "remove it; a file with null bytes is binary or not UTF-8 text (UTF-16?)",
    )


def too_deep(source: str, path: str) -> Diagnostic:
    """Diagnose source nested too deeply for the analysis, at its deepest statement."""
    line, column = _deepest(source)
    return Diagnostic(
        "S2S118",
        "this statement is nested too deeply for s2sgrad to analyse",
        path,
        line,
        column,
        line_text(split_lines(source), line),
        "split the expression into several statements with intermediate names",
    )


def _deepest(source: str) -> tuple[int, int]:
    """Return (line, column) of the statement holding the most deeply nested node."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1, 1
    best = (0, 1, 1)
    stack: list[tuple[ast.AST, int, tuple[int, int]]] = [(tree, 0, (1, 1))]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, ast.stmt):
            where = (node.lineno, node.col_offset + 1)
        if depth > best[0]:
            best = (depth, *where)
        stack.extend((child, depth + 1, where) for child in ast.iter_child_nodes(node))
    return best[1], best[2]


def parse(source: str, path: str) -> ParsedModule:
    """Parse `source` and return its checked differentiators."""
    tree = check_syntax(source, path)
    if not source.isascii():
        unnormalized = _unnormalized_names(source, path)
        if unnormalized:
            raise TransformError(unnormalized)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        text = line_text(split_lines(source), exc.editor_line)
        message = exc.message.removeprefix("parser error: ")
        raise TransformError(
            [
                Diagnostic(
                    "S2S001",
                    f"syntax error: {message}",
                    path,
                    exc.editor_line,
                    exc.editor_column,
                    text,
                )
            ]
        ) from None
    if _TUPLE_ARITHMETIC.search(source) or _LIST_RETURN.search(source):
        module = _spell_tuple_returns(module)
    if _multiline_elements(tree):
        module = module.visit(_ParenthesizedElements())
    try:
        return _parse_module(module, source, path, tree)
    except Exception as exc:
        # libcst's visitors recurse once per nesting level; a RecursionError may
        # also surface as another exception raised while handling it.
        if not _from_recursion(exc):
            raise
        raise TransformError([too_deep(source, path)]) from None


def _unnormalized_names(source: str, path: str) -> list[Diagnostic]:
    """S2S132 for each identifier not written in NFKC form (`ｓ`, fullwidth): Python
    reads it as its normal form (`s`), the same variable as a name spelled so, where
    a syntax tree keeps the spelling, and two spellings would be two variables."""
    found = []
    lines = split_lines(source)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.NAME or token.string.isascii():
            continue
        same = unicodedata.normalize("NFKC", token.string)
        if same != token.string:
            row, column = token.start
            found.append(
                Diagnostic(
                    "S2S132",
                    f"`{token.string}` is the name `{same}` to Python, which reads "
                    "identifiers in their normal (NFKC) form, but s2sgrad reads names "
                    "as they are spelled",
                    path,
                    row,
                    column + 1,
                    line_text(lines, row),
                    f"write `{same}`",
                )
            )
    return found


#: Module-level statements whose blocks s2sgrad does not read definitions from.
_BLOCKS = {
    cst.If: "if",
    cst.Try: "try",
    cst.TryStar: "try",
    cst.With: "with",
    cst.For: "for",
    cst.While: "while",
}


def _inside_blocks(
    module: cst.Module, tree: ast.Module, loc: Locator
) -> list[Diagnostic]:
    """S2S133 at each differentiator defined in a module-level block (`if
    torch.__version__ >= ...:`), which s2sgrad converts no more than a helper's
    nested def: with other differentiators beside it, it went missing from the
    generated module silently."""
    found = []
    for stmt, node in zip(module.body, tree.body, strict=True):
        block = _BLOCKS.get(type(stmt))
        if block is None or _main_guard(stmt):
            continue
        defs = [
            d
            for d in nodes(stmt)
            if isinstance(d, cst.FunctionDef) and checks.backward_name(d)
        ]
        # The same name may be defined in each branch: pair them in order.
        where = [d for d in ast.walk(node) if isinstance(d, ast.FunctionDef)]
        where.sort(key=lambda d: (d.lineno, d.col_offset))
        for function in defs:
            name = function.name.value
            at = next(d for d in where if d.name == name)
            where.remove(at)
            found.append(
                loc.at(
                    "S2S133",
                    at.lineno,
                    at.col_offset + 5,
                    f"`{name}` is a differentiator defined inside a module-level "
                    f"`{block}`: s2sgrad converts module-level functions, and "
                    "would leave it out",
                    f"define `{name}` at module level, and choose inside it what "
                    "the block chose",
                )
            )
    return found


def _main_guard(stmt: cst.BaseStatement) -> bool:
    """Whether `stmt` is `if __name__ == "__main__":`, which an import never runs."""
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.Comparison):
        return False
    test = stmt.test
    if len(test.comparisons) != 1 or not isinstance(
        test.comparisons[0].operator, cst.Equal
    ):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    return any(is_name(a, "__name__") for a in sides) and any(
        isinstance(b, cst.SimpleString) and b.evaluated_value == "__main__"
        for b in sides
    )


def _multiline_elements(tree: ast.Module) -> bool:
    """Whether a tuple or list display has an element over several lines, which
    `_ParenthesizedElements` may have to wrap."""
    return any(
        isinstance(node, (ast.Tuple, ast.List))
        and any(e.end_lineno != e.lineno for e in node.elts)
        for node in ast.walk(tree)
    )


class _ParenthesizedElements(cst.CSTTransformer):
    """Wrap an element of a tuple or list display in parentheses where it breaks a
    line outside brackets of its own (`return (\n    g\n    * w,\n    g * x,\n)`,
    as black lays out a long element): the display's brackets hold that line break,
    and the element, moved into a statement of its own (`grad_x = g * w`), would
    not parse. Lines stay as they were; the element's first line moves by one
    column after the parenthesis."""

    def leave_Element(
        self, original_node: cst.Element, updated_node: cst.Element
    ) -> cst.Element:
        value = updated_node.value
        text = cst.Module([]).code_for_node(value)
        if "\n" not in text:
            return updated_node
        try:
            ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            wrapped = value.with_changes(
                lpar=[cst.LeftParen(), *value.lpar],
                rpar=[*value.rpar, cst.RightParen()],
            )
            return updated_node.with_changes(value=wrapped)
        return updated_node


#: `return (grad,) + (None,) * 3` and the like, somewhere in the source.
_TUPLE_ARITHMETIC = re.compile(r"\breturn\b[^\n]*\)\s*[+*]")
#: `return [grad]`, somewhere in the source.
_LIST_RETURN = re.compile(r"\breturn\s*\[")


def _spell_tuple_returns(module: cst.Module) -> cst.Module:
    """`module` with `_TupleReturns` applied to the top-level statements that hold a
    return it may rewrite; the others are kept as they are (rebuilding every node
    of a large module cost more than parsing it)."""
    body = []
    for stmt in module.body:
        lists = isinstance(stmt, cst.FunctionDef) and _one_plain_param(stmt)
        finder = _NestedReturns(lists)
        if any(
            isinstance(n, cst.Return)
            and isinstance(n.value, (cst.BinaryOperation, cst.List))
            for n in nodes(stmt)
        ):
            walk(stmt, finder)  # where it is nested
        rewrite = _TupleReturns(lists)
        body.append(as_statement(stmt.visit(rewrite)) if finder.found else stmt)
    return module.with_changes(body=body)


def _one_plain_param(function: cst.FunctionDef) -> bool:
    """Whether `function` takes exactly one parameter, and not a list of tensors:
    its backward returns one gradient, which `return [grad]` holds in a list."""
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    if len(every) != 1 or isinstance(params.star_arg, cst.Param) or params.star_kwarg:
        return False
    return not checks.list_annotated(every[0])


class _NestedReturns(cst.CSTVisitor):
    """Find a `return a + b` or `return a * b` inside a nested function, or where
    `lists`, a `return [grad]` of backward's own."""

    def __init__(self, lists: bool = False) -> None:
        self.depth = 0
        self.found = False
        self.lists = lists

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.depth -= 1

    def visit_Return(self, node: cst.Return) -> None:
        if self.depth >= 2 and isinstance(node.value, cst.BinaryOperation):
            self.found = True
        elif self.lists and self.depth == 2 and _one_item_list(node.value):
            self.found = True


def _one_item_list(node: cst.BaseExpression | None) -> bool:
    return (
        isinstance(node, cst.List)
        and len(node.elements) == 1
        and isinstance(node.elements[0], cst.Element)
    )


class _TupleReturns(DepthTransformer):
    """Spell `return (grad,) + (None,) * 3`, the idiom of hand-written Functions, as
    the tuple it makes, `return (grad, None, None, None)`, inside nested functions
    (backward). Only one-line returns of tuple literals joined by `+` and repeated by
    an integer literal: lines and every other position stay as they were.

    Where `lists` (a differentiator of one parameter), backward's own `return
    [grad]` is spelled `return (grad,)`, the one-entry tuple it stands for: a list
    with several entries unpacks into the gradients as a tuple does, but one bare
    gradient could not be told from a list of one (autograd takes no list)."""

    def __init__(self, lists: bool = False) -> None:
        super().__init__()
        self.lists = lists

    def leave_Return(
        self, original_node: cst.Return, updated_node: cst.Return
    ) -> cst.Return:
        value = updated_node.value
        if self.lists and self.depth == 2 and isinstance(value, cst.List):
            if not _one_item_list(value):
                return updated_node
            (item,) = value.elements
            comma = item.comma if isinstance(item.comma, cst.Comma) else cst.Comma()
            return updated_node.with_changes(
                value=cst.Tuple(
                    [item.with_changes(comma=comma)],
                    lpar=[cst.LeftParen(value.lbracket.whitespace_after)],
                    rpar=[cst.RightParen(value.rbracket.whitespace_before)],
                )
            )
        if self.depth < 2 or not isinstance(value, cst.BinaryOperation):
            return updated_node
        if "\n" in cst.Module([]).code_for_node(value):
            return updated_node
        elements = _tuple_elements(value)
        if elements is None:
            return updated_node
        last = len(elements) - 1
        flat = [
            e.with_changes(
                comma=(
                    cst.MaybeSentinel.DEFAULT
                    if i == last
                    else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
            )
            for i, e in enumerate(elements)
        ]
        return updated_node.with_changes(
            value=cst.Tuple(flat, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        )


def _tuple_elements(node: cst.BaseExpression) -> list[cst.Element] | None:
    """The elements of a tuple made of tuple literals by `+` and `* <int>`."""
    if isinstance(node, cst.Tuple):
        elements = [e for e in node.elements if isinstance(e, cst.Element)]
        return elements if len(elements) == len(node.elements) else None
    if not isinstance(node, cst.BinaryOperation):
        return None
    if isinstance(node.operator, cst.Add):
        left, right = _tuple_elements(node.left), _tuple_elements(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node.operator, cst.Multiply):
        for items, times in ((node.left, node.right), (node.right, node.left)):
            repeated = _tuple_elements(items)
            if repeated is not None and isinstance(times, cst.Integer):
                count = int(times.value, 0)
                if 0 <= count <= 64 and all(is_name(e.value, "None") for e in repeated):
                    return repeated * count
    return None


def _returns_flat(forward: cst.FunctionDef) -> bool:
    """Whether a differentiator ends in the flat form, `return a, b, backward`."""
    ret = checks.final_return(forward)
    return (
        ret is not None
        and isinstance(ret.value, cst.Tuple)
        and len(ret.value.elements) > 2
    )


def _calls_of_flat(
    forward: cst.FunctionDef, flat: frozenset[str], loc: Locator
) -> list[Diagnostic]:
    """Diagnose calls of a differentiator that returns its outputs flat: composition
    reads a call's result as `(result, backward)`."""
    if not flat:
        return []
    calls = findall(
        forward, cst.Call, lambda c: is_name(c.func) and c.func.value in flat
    )
    found = []
    for call in calls[:1]:
        assert isinstance(call.func, cst.Name)
        name = call.func.value
        found.append(
            loc.error(
                "S2S127",
                call,
                f"`{name}` returns its outputs flat (`return a, b, backward`), and "
                f"`{forward.name.value}` calls it: a differentiator that others call "
                "returns `(result, backward)`",
                f"end `{name}` with `return (a, b), backward` (the same op, with the "
                f"same backward), then write `(a, b), _ = {name}(...)` here",
            )
        )
    return found


def _from_recursion(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, RecursionError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _parse_module(
    module: cst.Module, source: str, path: str, tree: ast.Module
) -> ParsedModule:
    """Check every top-level function; build records for the differentiators.

    Work is proportional to the differentiators, not to the module: positions are
    computed per function, only for those that need one, and scopes on a skeleton
    of the module where other functions and module-level values are stubbed out.
    """
    positions = _Positions(module, tree)
    loc = Locator(path, source, positions)
    found: list[Diagnostic] = []
    pending: list[tuple[cst.FunctionDef, str]] = []
    seen: dict[str, cst.FunctionDef] = {}
    found += _inside_blocks(module, tree, loc)
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef):
            continue
        positions.defer(stmt)
        lam = checks.lambda_backward(stmt)
        if lam is not None:
            found.append(
                loc.error(
                    "S2S109",
                    lam,
                    "backward must be a nested `def`, not a lambda",
                    "write `def backward(grad): ...` and return its name",
                )
            )
            continue
        bname = checks.backward_name(stmt)
        if bname is None:
            found += checks.check_nested_backward(stmt, loc)
            continue
        problems = checks.check_structure(stmt, bname, loc)
        first = seen.setdefault(stmt.name.value, stmt)
        if first is not stmt:
            problems.append(_defined_twice(stmt, first, positions, loc))
        if problems:
            found += problems
            continue
        positions.compute(stmt)
        pending.append((stmt, bname))
    helpers = _helpers(module, [f for f, _ in pending], seen)
    skeleton = _skeleton(module, {f for f, _ in pending} | set(helpers), source)
    # Scopes are libcst's, resolved once; parents and qualified names are read off
    # them and the functions' own nodes (what ParentNodeProvider and
    # QualifiedNameProvider compute, for every node of the module, in passes of
    # their own).
    scopes = Metadata(skeleton, unsafe_skip_copy=True).resolve(ScopeProvider)
    walks = {f: _collect(f) for f in [*(f for f, _ in pending), *helpers]}
    analysis = ScopeAnalysis(scopes, _parents(walks), positions, loc)
    analysis.learn_helpers(helpers, module)
    global_scope = next(s for s in scopes.values() if isinstance(s, GlobalScope))
    qualified = _qualified_names(skeleton, scopes, global_scope, walks.values())
    records: list[Differentiator] = []
    names = frozenset(stmt.name.value for stmt, _ in pending)
    flat = frozenset(stmt.name.value for stmt, _ in pending if _returns_flat(stmt))
    for stmt, bname in pending:
        own = names - {stmt.name.value}
        found += _calls_of_flat(stmt, flat & own, loc)
        found += checks.check_sibling_closures(stmt, bname, own - flat, loc)
        record, problems = _build(stmt, bname, analysis, loc, qualified, walks[stmt])
        found += problems
        if record is not None:
            records.append(record)
    if found:
        raise TransformError(sorted(found, key=lambda d: (d.line, d.column)))
    used = sorted({n for r in records for n in r.globals_used})
    globals_ = {
        n: global_name(n, global_scope) for n in used if n in _bound(global_scope)
    }
    helper_records = {
        f.name.value: Helper(
            f.name.value,
            f,
            {n: qualified[n] for n in walks[f].nodes if n in qualified},
        )
        for f in helpers
    }
    return ParsedModule(
        path,
        source,
        loc.lines,
        module,
        tuple(records),
        globals_,
        _bound(global_scope),
        helper_records,
        _constants(module),
    )


def _constants(module: cst.Module) -> dict[str, cst.BaseExpression]:
    """Module-level names bound exactly once, by `NAME = value` (or annotated)."""
    values: dict[str, cst.BaseExpression] = {}
    counts: dict[str, int] = {}
    for stmt in module.body:
        for name in _bound_names(stmt) or []:
            counts[name] = counts.get(name, 0) + 1
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            continue
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value = small.targets[0].target, small.value
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            target, value = small.target, small.value
        else:
            continue
        if isinstance(target, cst.Name):
            values[target.value] = value
    return {name: value for name, value in values.items() if counts.get(name) == 1}


def _helpers(
    module: cst.Module,
    differentiators: list[cst.FunctionDef],
    defined: dict[str, cst.FunctionDef],
) -> list[cst.FunctionDef]:
    """The plain module-level functions the differentiators call, directly or not.

    A name counts when it is called anywhere in a differentiator or in a helper found
    so far; the function is kept whole for the scope analysis (its body is read to
    infer what it returns).
    """
    functions = {
        s.name.value: s
        for s in module.body
        if isinstance(s, cst.FunctionDef) and s.name.value not in defined
    }
    found: dict[str, cst.FunctionDef] = {}
    todo = list(differentiators)
    while todo:
        node = todo.pop()
        for call in findall(node, cst.Call, calls_name):
            assert isinstance(call.func, cst.Name)
            name = call.func.value
            if name in functions and name not in found:
                found[name] = functions[name]
                todo.append(functions[name])
    return [
        s for s in module.body if isinstance(s, cst.FunctionDef) and s in found.values()
    ]


def _defined_twice(
    again: cst.FunctionDef, first: cst.FunctionDef, positions: _Positions, loc: Locator
) -> Diagnostic:
    name = again.name.value
    line = positions.def_lines[first]
    return loc.error(
        "S2S119",
        again,
        f"differentiator `{name}` is defined more than once (first on line {line})",
        "rename one of them, or delete the one that is not meant (Python keeps the "
        "last one)",
    )


class _Positions(Mapping[cst.CSTNode, CodeRange]):
    """Source positions of the nodes of the top-level functions that need them.

    Each function is laid out alone (libcst's PositionProvider on a one-function
    module) and shifted to the line Python's own parser gives its `def`, so the
    cost is in the size of the functions looked at, not of the module; a position
    is shifted when it is read. `defer(f)` makes a lookup that misses compute `f`'s
    positions (`in` and `get` look only at what is computed, as a dict's do).
    """

    def __init__(self, module: cst.Module, tree: ast.Module) -> None:
        self.module = module
        functions = [s for s in module.body if isinstance(s, cst.FunctionDef)]
        lines = [
            node.lineno
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        assert len(functions) == len(lines), "libcst and ast disagree on functions"
        self.def_lines: dict[cst.FunctionDef, int] = dict(
            zip(functions, lines, strict=True)
        )
        self.deferred: cst.FunctionDef | None = None
        self.done: set[cst.FunctionDef] = set()
        #: Positions in each function's own layout, and the lines to add to them.
        self.local: dict[cst.CSTNode, CodeRange] = {}
        self.shift: dict[cst.CSTNode, int] = {}

    def defer(self, function: cst.FunctionDef) -> None:
        self.deferred = function

    def compute(self, function: cst.FunctionDef) -> None:
        if function in self.done:
            return
        self.done.add(function)
        mini = cst.Module(
            body=[function],
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
        )
        local = Metadata(mini, unsafe_skip_copy=True).resolve(PositionProvider)
        self.local.update(local)
        del self.local[mini]
        shift = self.def_lines[function] - local[function.name].start.line
        self.shift.update(dict.fromkeys(local, shift))

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        where = self.local.get(node)
        if where is None:
            if self.deferred is None or self.deferred in self.done:
                raise KeyError(node)
            self.compute(self.deferred)
            where = self.local[node]
        shift = self.shift[node]
        if not shift:
            return where
        return CodeRange(
            CodePosition(where.start.line + shift, where.start.column),
            CodePosition(where.end.line + shift, where.end.column),
        )

    def __contains__(self, node: object) -> bool:
        return node in self.local

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        return self[node] if node in self.local else default

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self.local)

    def __len__(self) -> int:
        return len(self.local)


def _skeleton(
    module: cst.Module, keep: set[cst.FunctionDef], source: str
) -> cst.Module:
    """The module reduced to `keep`, its imports and its module-level names.

    Scopes and qualified names inside the kept functions are the same as in the
    whole module: they depend on which module-level names exist and on what the
    imports bind, not on other functions' bodies or on module-level values. Each run
    of other statements becomes one `a = b = ... = ...` binding the same names, in
    the same place relative to the kept statements.
    """
    body: list[cst.BaseStatement] = []
    names: list[str] = []
    for stmt in module.body:
        bound = None if stmt in keep else _bound_names(stmt)
        if bound is None:
            body += _binding(names)
            names = []
            body.append(stmt)
        else:
            names += bound
    # `global X` inside a function binds a module-level X too.
    for declared in _GLOBAL.findall(source):
        names += [n for n in re.split(r"[\s,]+", declared) if n.isidentifier()]
    body += _binding(names)
    return module.with_changes(body=body)


_GLOBAL = re.compile(r"^[ \t]*global[ \t]+([\w \t,]+)", re.MULTILINE)


def _binding(names: list[str]) -> list[cst.SimpleStatementLine]:
    if not names:
        return []
    targets = [cst.AssignTarget(cst.Name(n)) for n in dict.fromkeys(names)]
    return [cst.SimpleStatementLine([cst.Assign(targets, cst.Ellipsis())])]


def _bound_names(stmt: cst.BaseStatement) -> list[str] | None:
    """The module-level names `stmt` binds, or None when it must be kept whole
    (imports, compound statements)."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return [stmt.name.value]
    if not isinstance(stmt, cst.SimpleStatementLine):
        return None
    if _alias_of(stmt) is not None:
        return None  # kept whole: its value's qualified name names the alias
    names: list[str] = []
    for small in stmt.body:
        if isinstance(small, (cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
            return None
        if isinstance(small, cst.Assign):
            for target in small.targets:
                names += _target_names(target.target)
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            names += _target_names(small.target)
    return names


def _target_names(target: cst.BaseExpression) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


def _bound(scope: GlobalScope) -> frozenset[str]:
    return frozenset(a.name for a in scope.assignments)


def _alias_of(stmt: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """`(name, value)` for a module-level alias of an imported name,
    `aten = torch.ops.aten` or `F = torch.nn.functional`; None for other statements."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target, value = small.targets[0].target, small.value
    if not isinstance(target, cst.Name) or not isinstance(value, cst.Attribute):
        return None
    return target.value, value


def _parents(
    walks: Mapping[cst.FunctionDef, _Collect],
) -> dict[cst.CSTNode, cst.CSTNode]:
    """The parent of every node inside the functions walked."""
    return {
        child: parent for w in walks.values() for child, parent in w.parents.items()
    }


def _qualified_names(
    skeleton: cst.Module,
    scopes: Mapping[cst.CSTNode, Scope | None],
    global_scope: GlobalScope,
    walks: Iterable[_Collect],
) -> dict[cst.CSTNode, str]:
    """The qualified name of each name and attribute in the functions walked (as
    libcst's QualifiedNameProvider gives it: the scope's `get_qualified_names_for`)."""

    def names_of(node: cst.CSTNode) -> list[str]:
        scope = scopes.get(node)
        found = scope.get_qualified_names_for(node) if scope is not None else ()
        # Names through a function's locals (`f.<locals>.x.exp`) say nothing about
        # which library function runs; only module-level ones are kept.
        return sorted(q.name for q in found if "<locals>" not in q.name)

    # A module-level name bound once to an imported attribute stands for it:
    # `aten.slice` is `torch.ops.aten.slice` after `aten = torch.ops.aten`.
    aliases: dict[str, str] = {}
    for stmt in skeleton.body:
        alias = _alias_of(stmt)
        if alias is None or len(global_scope.assignments[alias[0]]) != 1:
            continue
        target = names_of(alias[1])
        if len(target) == 1:
            head, _, rest = target[0].partition(".")
            head = aliases.get(head, head)
            aliases[alias[0]] = f"{head}.{rest}" if rest else head
    out: dict[cst.CSTNode, str] = {}
    for walked in walks:
        for node in walked.nodes:
            if isinstance(node, (cst.Name, cst.Attribute)):
                known = names_of(node)
                if known:
                    head, dot, rest = known[0].partition(".")
                    out[node] = aliases.get(head, head) + dot + rest
    return out


def _build(
    forward: cst.FunctionDef,
    bname: str,
    analysis: ScopeAnalysis,
    loc: Locator,
    qualified: dict[cst.CSTNode, str],
    walk: _Collect,
) -> tuple[Differentiator | None, list[Diagnostic]]:
    backward = next(d for d in checks.nested_defs(forward) if d.name.value == bname)
    facts = analysis.analyse(forward, backward)
    if facts.diagnostics:
        return None, list(facts.diagnostics)
    pair = checks.returned_pair(forward)
    assert pair is not None
    result = pair[0]
    outputs = (
        tuple(e.value for e in result.elements)
        if isinstance(result, cst.Tuple)
        else (result,)
    )
    body = list(forward.body.body)
    if forward.get_docstring(clean=False) is not None:
        body = body[1:]
    statements = tuple(
        s for s in body[:-1] if s is not backward and isinstance(s, cst.BaseStatement)
    )
    grads = tuple(
        p.name.value for p in (*backward.params.posonly_params, *backward.params.params)
    )
    nodes = walk.nodes
    returns = [n for n in walk.inside(backward) if type(n) is cst.Return]
    params = _params(forward, returns)
    pragmas, problems = _pragmas([n for n in nodes if type(n) is cst.Comment], loc)
    problems += _unflattened_containers(params, loc)
    if problems:
        return None, problems
    first = loc.line_of(forward)
    last = analysis.positions[forward].end.line
    record = Differentiator(
        name=forward.name.value,
        forward=forward,
        params=params,
        statements=statements,
        backward=backward,
        grad_params=grads,
        result=result,
        outputs=outputs,
        tuple_result=isinstance(result, cst.Tuple),
        captures=facts.captures,
        docstring=forward.get_docstring(clean=True),
        first_line=first,
        last_line=last,
        backward_line=loc.line_of(backward),
        returns_bare_none=_returns_bare_none(returns),
        returns_tuples=all(
            isinstance(r.value, cst.Tuple) or _returns_bare_none([r]) for r in returns
        ),
        globals_used=facts.globals_used,
        local_names=facts.local_names | {p.name for p in params},
        qualified_names={n: qualified[n] for n in nodes if n in qualified},
        statement_lines={
            n: analysis.positions[n].start.line
            for n in nodes
            if type(n) in STATEMENT_CLASSES and n in analysis.positions
        },
        pragmas=pragmas,
        writes=facts.writes,
        handing_back=analysis.handing_back,
        backward_locals=facts.backward_locals,
    )
    return record, []


class _Collect(cst.CSTVisitor):
    """Every node of a subtree in source order, each node's parent, and where each
    function's nodes are: one walk of a function that every later question reads."""

    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.spans: dict[cst.CSTNode, tuple[int, int]] = {}
        self._open: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if type(node) is cst.FunctionDef:  # a leaf class: no ABC `isinstance`
            self.spans[node] = (len(self.nodes), -1)
        if self._open:
            self.parents[node] = self._open[-1]
        self._open.append(node)
        self.nodes.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._open.pop()
        if type(original_node) is cst.FunctionDef:
            self.spans[original_node] = (self.spans[original_node][0], len(self.nodes))

    def inside(self, function: cst.FunctionDef) -> list[cst.CSTNode]:
        start, end = self.spans[function]
        return self.nodes[start:end]


def _collect(root: cst.CSTNode) -> _Collect:
    """Walk `root`'s subtree once, `root` included."""
    collect = _Collect()
    walk(root, collect)
    return collect


def _params(forward: cst.FunctionDef, returns: list[cst.Return]) -> tuple[Param, ...]:
    p = forward.params
    ordered = [(x, False) for x in (*p.posonly_params, *p.params)]
    ordered += [(x, True) for x in p.kwonly_params]
    slots = _gradient_slots(returns, len(ordered))
    code = cst.Module([]).code_for_node
    return tuple(
        Param(
            name=param.name.value,
            node=param,
            keyword_only=kw,
            annotation=code(param.annotation.annotation) if param.annotation else None,
            gets_gradient=slots[i],
        )
        for i, (param, kw) in enumerate(ordered)
    )


def _unflattened_containers(
    params: tuple[Param, ...], loc: Locator
) -> list[Diagnostic]:
    """S2S130 for a parameter that takes a gradient and whose annotation says it may
    be a container of tensors other than a list or tuple of them (`Optional[List[
    Tensor]]`, `Dict[str, Tensor]`): the Function would take it as one opaque input,
    and its tensors would silently get no gradient."""
    # values imports the frontend's model, so it is imported here, not at the top.
    from s2sgrad.values import NONE, SEQ, param_value

    found = []
    for param in params:
        annotation = param.node.annotation
        if annotation is None or not param.gets_gradient:
            continue
        value = param_value(param)
        if SEQ not in value.kinds or not value.holds_tensor or value.tensor_list:
            continue
        if value.kinds == {SEQ, NONE}:
            what = "may be None or a container of tensors"
        elif value.kinds != {SEQ}:
            what = "may be a container of tensors or another value"
        else:
            what = f"is a {value.form or 'container'} holding tensors"
        found.append(
            loc.error(
                "S2S130",
                annotation.annotation,
                f"`{param.name}` takes a gradient and {what}: s2sgrad hands the "
                "Function a parameter's tensors one by one only when it is always a "
                "list or tuple of tensors, and the tensors of any other value would "
                "get no gradient",
                f"annotate it `{param.name}: list[torch.Tensor]` (an empty list "
                "for none), or pass the tensors as parameters of their own",
            )
        )
    return found


def _gradient_slots(returns: list[cst.Return], n: int) -> list[bool]:
    """Tell, per forward parameter, whether some return of backward may give a gradient."""
    slots = [False] * n
    for ret in returns:
        value = ret.value
        if value is None or is_name(value, "None"):
            continue
        if isinstance(value, cst.Tuple) and len(value.elements) == n:
            for i, element in enumerate(value.elements):
                if not is_name(element.value, "None"):
                    slots[i] = True
        else:
            slots = [True] * n
    return slots


def _returns_bare_none(returns: list[cst.Return]) -> bool:
    return any(r.value is None or is_name(r.value, "None") for r in returns)


def _pragmas(
    comments: list[cst.Comment], loc: Locator
) -> tuple[dict[str, str], list[Diagnostic]]:
    """Read `# s2sgrad: key=value` comments above the def and inside it.

    A comment that starts like a pragma but names an unknown key or value, or that
    cannot be read as `key=value`, is an error (S2S122): a typo must not silently
    fall back to the default.
    """
    found: dict[str, str] = {}
    problems: list[Diagnostic] = []
    for comment in comments:
        start = _PRAGMA_START.match(comment.value)
        if start is None:
            continue
        text = start.group(1)
        pairs = _PRAGMA_PAIR.findall(text)
        rest = _PRAGMA_PAIR.sub("", text).strip(" \t,")
        if rest or not pairs:
            problems.append(
                loc.error(
                    "S2S122",
                    comment,
                    f"cannot read `{comment.value.strip()}` as a pragma",
                    f"write `# s2sgrad: key=value` ({_known_pragmas()})",
                )
            )
            continue
        for key, value in pairs:
            problem = _check_pragma(key, value, comment, loc)
            if problem is None:
                found[key] = value
            else:
                problems.append(problem)
    return found, problems


def read_pragmas(function: cst.FunctionDef, loc: Locator) -> dict[str, str]:
    """The pragmas of one function, for a tool that reads them without converting it
    (s2sgrad.testing); raise TransformError (S2S122) on one s2sgrad does not know."""
    comments = [n for n in _collect(function).nodes if isinstance(n, cst.Comment)]
    found, problems = _pragmas(comments, loc)
    if problems:
        raise TransformError(problems)
    return found


def _known_pragmas() -> str:
    return "; ".join(f"{k}={'|'.join(v)}" for k, v in PRAGMAS.items())


def _check_pragma(
    key: str, value: str, comment: cst.Comment, loc: Locator
) -> Diagnostic | None:
    if key not in PRAGMAS:
        close = difflib.get_close_matches(key, list(PRAGMAS), n=1)
        hint = f"did you mean `{close[0]}`?" if close else f"known: {_known_pragmas()}"
        return loc.error("S2S122", comment, f"unknown pragma `{key}`", hint)
    allowed = PRAGMAS[key]
    if value not in allowed:
        close = difflib.get_close_matches(value, list(allowed), n=1)
        hint = (
            f"did you mean `{key}={close[0]}`?"
            if close
            else f"write one of {', '.join(f'`{key}={v}`' for v in allowed)}"
        )
        return loc.error(
            "S2S122", comment, f"`{value}` is not a value of the pragma `{key}`", hint
        )
    return None
