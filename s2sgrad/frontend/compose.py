"""Composition: forward keeps another differentiator's closure, backward calls it.

Takes source text and its display path; returns `Composed`: the source with each
closure that forward keeps from another differentiator of the module, and that backward
calls, written as the calls the rest of s2sgrad translates, and the problems found
where that cannot be done. Runs before the frontend, which accepts a sibling's closure
only called in backward as `inner(x)[1](grad)`.

`y, back_y = inner(a, b)` in forward and `back_y(g)` in backward mean
`inner(a', b')[1](g)`, where a' and b' are the values the arguments had at the call:
`inner`'s closure is its backward over a context that its forward computes from its
arguments alone (it draws no random numbers: `check_draws`, S2S121), so computing it
again from the same values gives the same closure. So, where forward rebinds `h` later,

    y, back_y = inner(h, w)         ->   back_y_h = h; y, _ = inner(back_y_h, w)
    ... back_y(g) ...  (backward)   ->   ... inner(back_y_h, w)[1](g) ...

An argument that is a literal, or a name that forward binds nowhere after the call (a
loop around the call binds again all it binds) and backward binds nowhere, is read as
it is; any other is bound to a fresh name right before the call, on its line, so that
backward reads its value at the call (a capture like any other: saved, or promoted when
it carries a gradient). The generated code calls `inner_forward` in forward and
`inner_backward(inner_forward(a', b')[1], g)` in backward: the context is recomputed
where backward runs and autograd differentiates it there, so every order is right.
Where forward reads `_`, the result is taken as `y = inner(...)[0]` instead.

Any other use of the closure (called in forward, returned, passed to a function,
stored, used in another nested function, bound again where forward's last binding
cannot be told) is S2S120; a call with a number of gradients `inner`'s backward does
not take is S2S107. A closure of an imported function is left as it is (backward
recomputes what it captures from forward, closure included: right at every order).

Invariant: the rewritten source has the lines of the source, each in its place; only
the lines of the statements rewritten differ, and `Composed.restore` maps a diagnostic
located on one of them back to the source's text and column.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import (
    Assignment,
    CodeRange,
    ParentNodeProvider,
    PositionProvider,
    Scope,
    ScopeProvider,
)

from s2sgrad import opfacts
from s2sgrad.cst import (
    as_compound_or_line,
    as_statement,
    bound_anywhere,
    calls_name,
    dotted,
    findall,
    is_name,
    nodes,
    sole_target,
)
from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend import checks
from s2sgrad.frontend.metadata import Metadata
from s2sgrad.frontend.model import ParsedModule
from s2sgrad.lines import line_text, split_lines
from s2sgrad.names import NameAllocator

#: `..., back = inner(`: a closure that forward may keep (a cheap first look).
_KEPT = re.compile(r",\s*([A-Za-z_]\w*)\s*[\])]?\s*=\s*([A-Za-z_]\w*)\s*\(")
_DEFINED = re.compile(r"^def\s+([A-Za-z_]\w*)", re.MULTILINE)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Composition:
    """One closure kept in forward and called in backward, as rewritten."""

    caller: str
    callee: str
    closure: str
    #: Where forward binds the closure that backward calls (1-based).
    line: int
    column: int


@dataclass(frozen=True)
class Composed:
    """The source with kept closures rewritten, and what could not be."""

    source: str
    compositions: tuple[Composition, ...] = ()
    problems: tuple[Diagnostic, ...] = ()
    #: The source's text of each line the rewrite changed, by line number.
    original: Mapping[int, str] = field(default_factory=dict)
    #: The closures with problems, each with the lines of its differentiator: the
    #: frontend's own reports of them (S2S120) are left out.
    refused: tuple[tuple[str, int, int], ...] = ()

    def restore(self, diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
        """`diagnostics` located in the rewritten source, located in the source."""
        return [self._restored(d) for d in diagnostics]

    def merged(self, diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
        """The frontend's `diagnostics` on the rewritten source, and the problems."""
        kept = [
            d
            for d in self.restore(diagnostics)
            if d.code != "S2S120"
            or not any(
                first <= d.line <= last and d.message.startswith(f"`{closure}`, ")
                for closure, first, last in self.refused
            )
        ]
        return sorted([*kept, *self.problems], key=lambda d: (d.line, d.column))

    def _restored(self, diagnostic: Diagnostic) -> Diagnostic:
        text = self.original.get(diagnostic.line)
        if text is None:
            return diagnostic
        rewritten = line_text(split_lines(self.source), diagnostic.line)
        column = _column_in(text, rewritten, diagnostic.column)
        shown = text if diagnostic.source_line else ""
        return Diagnostic(
            diagnostic.code,
            diagnostic.message,
            diagnostic.path,
            diagnostic.line,
            column,
            shown,
            diagnostic.hint,
        )


def _column_in(text: str, rewritten: str, column: int) -> int:
    """The column of `text` that `column` of `rewritten` was copied from (the start
    of the source's span where it points into something the rewrite wrote)."""
    at = column - 1
    matcher = difflib.SequenceMatcher(None, rewritten, text, autojunk=False)
    for tag, i1, i2, j1, _ in matcher.get_opcodes():
        if i1 <= at < i2:
            return j1 + (at - i1 if tag == "equal" else 0) + 1
    return min(column, len(text) + 1)


def compose(source: str, path: str) -> Composed:
    """Rewrite the closures that forward keeps and backward calls (see the module)."""
    called = {f for b, f in _KEPT.findall(source) if b != "_"}
    if not called & set(_DEFINED.findall(source)):
        return Composed(source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Composed(source)  # the frontend reports it
    lines = split_lines(source, keepends=True)
    functions = _functions(tree, lines)
    callees = _callees(functions, called)
    if not callees:
        return Composed(source)
    compositions: list[Composition] = []
    problems: list[Diagnostic] = []
    refused: list[tuple[str, int, int]] = []
    original: dict[int, str] = {}
    module_names = _module_names(tree)
    for function in functions.values():
        if not function.calls(callees):
            continue
        names = NameAllocator({*module_names, *_IDENTIFIER.findall(function.text)})
        caller = _Caller(function, callees, path, names)
        found = caller.rewrite()
        compositions += caller.compositions
        problems += caller.problems
        refused += [(c, function.first, function.last) for c in caller.refused]
        if found is None:
            continue
        new = split_lines(found, keepends=True)
        assert len(new) == function.last - function.first + 1, "a rewrite moved lines"
        for number, (old, now) in enumerate(
            zip(lines[function.first - 1 : function.last], new, strict=True),
            start=function.first,
        ):
            if old != now:
                original[number] = old.rstrip("\r\n")
        lines[function.first - 1 : function.last] = new
    return Composed(
        "".join(lines) if original else source,
        tuple(compositions),
        tuple(sorted(problems, key=lambda d: (d.line, d.column))),
        original,
        tuple(refused),
    )


def _module_names(tree: ast.Module) -> set[str]:
    """The names bound at module level (a fresh name must not hide one)."""
    found: set[str] = set()
    for node in tree.body:
        for bound in (
            ast.walk(node) if not isinstance(node, ast.FunctionDef) else [node]
        ):
            if isinstance(bound, ast.Name) and isinstance(bound.ctx, ast.Store):
                found.add(bound.id)
            elif isinstance(
                bound, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                found.add(bound.name)
            elif isinstance(bound, ast.alias):
                found.add((bound.asname or bound.name).split(".")[0])
    return found


@dataclass(frozen=True)
class _Function:
    """A module-level function: its lines and, parsed on demand, its tree."""

    name: str
    first: int
    last: int
    text: str
    node: ast.FunctionDef

    def calls(self, callees: Mapping[str, _Callee]) -> bool:
        """Whether forward unpacks a pair from a call of one of `callees`."""
        for node in ast.walk(self.node):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id in callees
                and node.value.func.id != self.name
                and any(
                    isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == 2
                    for t in node.targets
                )
            ):
                return True
        return False

    def tree(self) -> cst.FunctionDef | None:
        try:
            module = cst.parse_module(self.text)
        except cst.ParserSyntaxError:
            return None
        found = [s for s in module.body if isinstance(s, cst.FunctionDef)]
        return found[0] if len(found) == 1 else None


def _functions(tree: ast.Module, lines: Sequence[str]) -> dict[str, _Function]:
    """Module-level functions defined once, by name."""
    found: dict[str, _Function] = {}
    twice: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.AsyncFunctionDef):
            twice.add(node.name)
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        if node.name in found:
            twice.add(node.name)
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        text = "".join(lines[first - 1 : node.end_lineno])
        found[node.name] = _Function(node.name, first, node.end_lineno, text, node)
    return {name: f for name, f in found.items() if name not in twice}


@dataclass(frozen=True)
class _Callee:
    """A differentiator whose closure others may keep: what its closure takes."""

    name: str
    params: tuple[str, ...]
    #: The closure's positional gradient parameters, and how many have no default.
    grads: tuple[str, ...]
    required: int
    variadic: bool


def _callees(
    functions: Mapping[str, _Function], wanted: set[str]
) -> dict[str, _Callee]:
    """The differentiators among `wanted`: those that return `(result, backward)`."""
    found: dict[str, _Callee] = {}
    for name in sorted(wanted & set(functions)):
        node = functions[name].tree()
        bname = checks.backward_name(node) if node is not None else None
        if node is None or bname is None:
            continue
        pair = checks.final_return(node)
        if pair is not None and isinstance(pair.value, cst.Tuple):
            if len(pair.value.elements) > 2:
                continue  # flat outputs: S2S127 in the frontend
        backward = next(d for d in checks.nested_defs(node) if d.name.value == bname)
        p = backward.params
        grads = tuple(x.name.value for x in (*p.posonly_params, *p.params))
        required = sum(1 for x in (*p.posonly_params, *p.params) if x.default is None)
        forward = tuple(
            x.name.value for x in (*node.params.posonly_params, *node.params.params)
        )
        variadic = isinstance(p.star_arg, cst.Param)
        found[name] = _Callee(name, forward, grads, required, variadic)
    return found


def _keeps(assign: cst.Assign) -> bool:
    """Whether `assign` is `T, back = f(...)` (or `[T, back] = f(...)`): the
    statement that keeps a closure."""
    target = sole_target(assign)
    if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
        return False
    first, second = target.elements
    return (
        isinstance(first, cst.Element)
        and isinstance(second, cst.Element)
        and is_name(second.value)
        and calls_name(assign.value)
    )


_LOOPS = (cst.For, cst.While)


class _Caller:
    """One differentiator whose forward keeps closures of others: find them, judge
    their uses, and rewrite those that backward only calls."""

    def __init__(
        self,
        function: _Function,
        callees: Mapping[str, _Callee],
        path: str,
        names: NameAllocator,
    ) -> None:
        self.function = function
        self.callees = callees
        self.path = path
        self.names = names
        self.lines = split_lines(function.text)
        self.compositions: list[Composition] = []
        self.problems: list[Diagnostic] = []
        self.refused: list[str] = []
        #: Small statements to write as others, and backward's calls to rewrite.
        self.statements: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = {}
        self.calls: dict[cst.CSTNode, cst.Call] = {}

    def rewrite(self) -> str | None:
        """The function's text rewritten, or None where there is nothing to do."""
        node = self.function.tree()
        bname = checks.backward_name(node) if node is not None else None
        if node is None or bname is None:
            return None
        self.node = node
        self.backward = next(
            d for d in checks.nested_defs(node) if d.name.value == bname
        )
        wrapper = Metadata(cst.Module(body=[node]), unsafe_skip_copy=True)
        self.scopes = wrapper.resolve(ScopeProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions: Mapping[cst.CSTNode, CodeRange] = wrapper.resolve(
            PositionProvider
        )
        scope = self.scopes[self.backward]
        assert scope is not None
        self.scope: Scope = scope
        self.in_backward = _bound_anywhere(self.backward)
        self.underscore = self._reads("_")
        kept: dict[str, list[cst.Assign]] = {}
        for found in findall(node.body, cst.Assign, _keeps):
            assert isinstance(found.value, cst.Call)
            callee = found.value.func
            assert isinstance(callee, cst.Name)
            if (
                callee.value in self.callees
                and callee.value != node.name.value
                and self.scopes.get(found) is self.scope
                and callee.value not in self.scope.assignments
                and _closure_of(found) != "_"
            ):
                kept.setdefault(_closure_of(found), []).append(found)
        for closure, bindings in kept.items():
            self._judge(closure, bindings)
        if not self.statements and not self.calls:
            return None
        rewritten = as_statement(node.visit(_Rewrite(self.statements, self.calls)))
        module = cst.Module(body=[as_compound_or_line(rewritten)])
        return module.code

    def _judge(self, closure: str, bindings: list[cst.Assign]) -> None:
        """Rewrite `closure`'s bindings and calls, or report why they cannot be."""
        assignments = [
            a for a in self.scope.assignments[closure] if isinstance(a, Assignment)
        ]
        uses = {
            id(access.node): access.node
            for assignment in assignments
            for access in assignment.references
            if isinstance(access.node, cst.Name)
        }
        if not uses:
            return  # `y, back = inner(x)` and nothing else: the frontend takes it
        last = max(bindings, key=self._start)
        callee = self.callees[_callee_of(last)]
        problems = self._bindings(closure, callee, bindings, assignments)
        calls: list[cst.Call] = []
        for use in sorted(uses.values(), key=self._start):
            parent = self.parents[use]
            if (
                self._inside(use, self.backward)
                and isinstance(parent, cst.Call)
                and parent.func is use
            ):
                calls.append(parent)
                problems += self._arity(parent, closure, callee)
            else:
                problems.append(self._misuse(use, closure, callee))
        if problems:
            self.problems += problems
            self.refused.append(closure)
            return
        arguments = self._arguments(last, closure, callee)
        for binding in bindings:
            self.statements[binding] = self._forward(
                binding, arguments, binding is last
            )
        for call in calls:
            args = [argument.read() for argument in arguments]
            self.calls[call] = cst.Call(cst.Name(callee.name), args)
        where = self._position(_target_of(last))
        self.compositions.append(
            Composition(self.node.name.value, callee.name, closure, *where)
        )

    def _bindings(
        self,
        closure: str,
        callee: _Callee,
        bindings: list[cst.Assign],
        assignments: list[Assignment],
    ) -> list[Diagnostic]:
        """S2S120 where backward cannot tell which binding of the closure it reads:
        another binding than a call, or several calls not all in forward's own
        body (there, the last one is what backward reads); or where backward binds
        the differentiator's name to something else."""
        hint = (
            f"call `{callee.name}` once and choose its arguments instead "
            "(`x if flag else -x`), or keep each closure in a name of its own, bound "
            "by one call; several calls may bind one name in forward's own body "
            "(backward reads the last one)"
        )
        targets = {id(_target_of(b)) for b in bindings}
        others = [a.node for a in assignments if id(a.node) not in targets]
        found = []
        for other in sorted(others, key=self._start)[:1]:
            found.append(
                self._error("S2S120", other, closure, callee, "is bound again", hint)
            )
        if len(bindings) > 1 and not all(self._top_level(b) for b in bindings):
            second = sorted(bindings, key=self._start)[1]
            what = (
                "is bound by more than one call, inside a block: which one backward "
                "calls depends on how forward ran"
            )
            found.append(
                self._error("S2S120", _target_of(second), closure, callee, what, hint)
            )
        if callee.name in self.in_backward:
            what = f"is called in backward, where `{callee.name}` names another value"
            found.append(
                self._error(
                    "S2S120",
                    _target_of(max(bindings, key=self._start)),
                    closure,
                    callee,
                    what,
                    f"rename what backward binds to `{callee.name}`",
                )
            )
        return found

    def _arguments(
        self, binding: cst.Assign, closure: str, callee: _Callee
    ) -> list[_Argument]:
        """Each argument of the call, and the fresh name forward binds it to first
        where backward cannot read it as it is."""
        call = binding.value
        assert isinstance(call, cst.Call)
        found = []
        for i, arg in enumerate(call.args):
            value = arg.value
            if _literal(value) or (
                isinstance(value, cst.Name) and not self._rebound(value.value, binding)
            ):
                found.append(_Argument(arg, None))
                continue
            if isinstance(value, cst.Name):
                stem = value.value
            elif arg.keyword is not None:
                stem = arg.keyword.value
            elif not arg.star and i < len(callee.params):
                stem = callee.params[i]
            else:
                stem = f"arg{i}"
            found.append(_Argument(arg, self.names.fresh(f"{closure}_{stem}")))
        return found

    def _forward(
        self, binding: cst.Assign, arguments: list[_Argument], last: bool
    ) -> list[cst.BaseSmallStatement]:
        """`T, back = f(args)` as `[back_a = a; ...] T, _ = f(back_a, ...)`."""
        call = binding.value
        assert isinstance(call, cst.Call)
        bound: list[cst.BaseSmallStatement] = []
        args = list(call.args)
        for i, argument in enumerate(arguments if last else []):
            if argument.fresh is None:
                continue
            value = argument.arg.value
            args[i] = argument.arg.with_changes(value=cst.Name(argument.fresh))
            if "\n" in cst.Module([]).code_for_node(value):
                # a line break inside the call's parentheses stays inside these
                value = value.with_changes(
                    lpar=[cst.LeftParen(), *value.lpar],
                    rpar=[*value.rpar, cst.RightParen()],
                )
            name = cst.AssignTarget(cst.Name(argument.fresh))
            bound.append(cst.Assign([name], value))
        call = call.with_changes(args=args)
        target = binding.targets[0].target
        assert isinstance(target, (cst.Tuple, cst.List))
        if self.underscore:
            # `_` is read: `T = f(args)[0]` binds nothing more
            kept = binding.targets[0].with_changes(target=target.elements[0].value)
            first = cst.Subscript(
                call, [cst.SubscriptElement(cst.Index(cst.Integer("0")))]
            )
            return [*bound, binding.with_changes(targets=[kept], value=first)]
        # `T, _ = f(args)`: as written, but for the closure's name
        second = target.elements[1].with_changes(value=cst.Name("_"))
        target = target.with_changes(elements=[target.elements[0], second])
        kept = binding.targets[0].with_changes(target=target)
        return [*bound, binding.with_changes(targets=[kept], value=call)]

    def _reads(self, name: str) -> bool:
        """Whether the function reads `name` anywhere (nested scopes included)."""
        for node in findall(self.node, cst.Name, lambda n: n.value == name):
            scope = self.scopes.get(node)
            if scope is not None and any(a.node is node for a in scope.accesses[name]):
                return True
        return False

    def _rebound(self, name: str, binding: cst.Assign) -> bool:
        """Whether `name` may hold another value where backward runs than at
        `binding`'s call: forward binds it in the statement, after it, or anywhere in
        a loop around it; or backward binds a name of its own so spelled."""
        if name in self.in_backward:
            return True
        if name not in self.scope.assignments:
            return False  # a global or a builtin
        loops = [a for a in self._ancestors(binding) if isinstance(a, _LOOPS)]
        start = self._start(binding)
        for assignment in self.scope.assignments[name]:
            if not isinstance(assignment, Assignment):
                continue
            node = assignment.node
            if node in self.positions and self._start(node) > start:
                return True
            if any(self._inside(node, loop) for loop in loops):
                return True
            if self._inside(node, binding.targets[0]):
                return True
        return any(
            (node in self.positions and self._start(node) > start)
            or any(self._inside(node, loop) for loop in loops)
            for node in self._changes_in_place(name)
        )

    def _changes_in_place(self, name: str) -> list[cst.CSTNode]:
        """Where forward changes the object `name` holds without binding the name:
        an in-place method (`h.mul_(3.0)`) or an item store (`h[0] = 0.0`,
        `h[i] += 1`). The values at the call are then not the values backward
        would read by that name."""
        found: list[cst.CSTNode] = []
        for node in nodes(self.node.body):
            if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                receiver, method = node.func.value, node.func.attr.value
                if (
                    isinstance(receiver, cst.Name)
                    and receiver.value == name
                    and opfacts.is_inplace(method)
                ):
                    found.append(node)
            targets: list[cst.BaseExpression] = []
            if isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if (
                    isinstance(target, cst.Subscript)
                    and isinstance(target.value, cst.Name)
                    and target.value.value == name
                ):
                    found.append(node)
        return found

    def _arity(self, call: cst.Call, closure: str, callee: _Callee) -> list[Diagnostic]:
        """S2S107 for a call of the closure with gradients its backward does not take."""
        if any(a.star for a in call.args):
            return []
        keywords = [a.keyword.value for a in call.args if a.keyword is not None]
        given = len(call.args)
        if callee.variadic:
            fits = given >= callee.required
        else:
            fits = callee.required <= given <= len(callee.grads)
        fits = fits and all(k in callee.grads for k in keywords)
        if fits:
            return []
        takes = (
            f"{callee.required} or more"
            if callee.variadic
            else (
                f"{callee.required} to {len(callee.grads)}"
                if callee.required != len(callee.grads)
                else str(callee.required)
            )
        )
        plural = "" if takes == "1" else "s"
        return [
            self._error(
                "S2S107",
                call,
                closure,
                callee,
                f"takes {takes} gradient{plural} (`{', '.join(callee.grads)}`), but "
                f"is called with {given}",
                f"pass one gradient per output of `{callee.name}`, in its order",
            )
        ]

    def _misuse(self, use: cst.Name, closure: str, callee: _Callee) -> Diagnostic:
        """S2S120 for a use of the closure other than a call in backward."""
        parent = self.parents[use]
        grandparent = self.parents.get(parent)
        code = cst.Module([]).code_for_node
        inner = self._enclosing(use)
        if inner is not None and inner is not self.backward:
            name = inner.name.value if isinstance(inner, cst.FunctionDef) else "lambda"
            what = f"is used inside `{name}`, which may keep it"
        elif isinstance(parent, cst.Call) and parent.func is use:
            what = "is called in forward"
        elif isinstance(parent, cst.Arg) and isinstance(grandparent, cst.Call):
            what = f"is passed to `{code(grandparent.func)}`"
        elif any(isinstance(a, cst.Return) for a in self._ancestors(use)):
            where = "backward" if inner is self.backward else "forward"
            what = f"is returned by {where}"
        elif isinstance(parent, (cst.Element, cst.DictElement)):
            # a List, Tuple, Set or Dict display
            what = f"is stored in a {type(grandparent).__name__.lower()}"
        elif isinstance(parent, cst.Assign):
            targets = ", ".join(code(t.target) for t in parent.targets)
            what = f"is stored in `{targets}`"
        elif isinstance(parent, (cst.AugAssign, cst.AnnAssign)):
            what = f"is stored in `{code(parent.target)}`"
        else:
            what = "is used other than called"
        if inner is None and "forward" not in what:
            what += " in forward"
        elif inner is self.backward and "backward" not in what:
            what += " in backward"
        return self._error("S2S120", use, closure, callee, what)

    def _error(
        self,
        code: str,
        node: cst.CSTNode,
        closure: str,
        callee: _Callee,
        what: str,
        hint: str | None = None,
    ) -> Diagnostic:
        line, column = self._position(node)
        text = line_text(self.lines, line - self.function.first + 1)
        return Diagnostic(
            code,
            f"`{closure}`, the closure of `{callee.name}`, {what}",
            self.path,
            line,
            column,
            text,
            hint
            or (
                f"call `{closure}(grad)` directly in backward: each call becomes "
                f"`{callee.name}(...)[1](grad)`, which recomputes `{callee.name}`'s "
                "context where backward runs, so gradients stay right at every order"
            ),
        )

    def _position(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.positions[node].start
        return start.line + self.function.first - 1, start.column + 1

    def _start(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.positions[node].start
        return start.line, start.column

    def _ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        found = []
        while node in self.parents and node is not self.node:
            node = self.parents[node]
            found.append(node)
        return found

    def _inside(self, node: cst.CSTNode, root: cst.CSTNode) -> bool:
        return node is root or any(a is root for a in self._ancestors(node))

    def _top_level(self, binding: cst.Assign) -> bool:
        line = self.parents[binding]
        return self.parents.get(line) is self.node.body

    def _enclosing(self, node: cst.CSTNode) -> cst.FunctionDef | cst.Lambda | None:
        """The outermost nested function `node` is in (None: forward's own body)."""
        found = None
        for ancestor in self._ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)) and (
                ancestor is not self.node
            ):
                found = ancestor
        return found


def _closure_of(binding: cst.Assign) -> str:
    closure = _pair_of(binding)[1]
    assert isinstance(closure, cst.Name)
    return closure.value


def _callee_of(binding: cst.Assign) -> str:
    assert isinstance(binding.value, cst.Call)
    assert isinstance(binding.value.func, cst.Name)
    return binding.value.func.value


def _pair_of(binding: cst.Assign) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    target = binding.targets[0].target
    assert isinstance(target, (cst.Tuple, cst.List))
    first, second = target.elements
    return first.value, second.value


def _target_of(binding: cst.Assign) -> cst.BaseExpression:
    return _pair_of(binding)[1]


def _literal(value: cst.BaseExpression) -> bool:
    """A number or a one-line string: the same wherever it is read."""
    if isinstance(value, cst.UnaryOperation) and isinstance(
        value.operator, (cst.Minus, cst.Plus)
    ):
        value = value.expression
    if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary)):
        return True
    return isinstance(value, cst.SimpleString) and "\n" not in value.value


@dataclass(frozen=True)
class _Argument:
    """An argument of the call that made a closure, and the fresh name forward binds
    its value to for backward (None: backward reads the argument as written)."""

    arg: cst.Arg
    fresh: str | None

    def read(self) -> cst.Arg:
        """The argument as backward's call of the differentiator passes it: one line."""
        value = (
            cst.Name(self.fresh)
            if self.fresh is not None
            else self.arg.value.deep_clone()
        )
        if self.arg.keyword is None:
            return cst.Arg(value, star=self.arg.star)
        no_space = cst.SimpleWhitespace("")
        return cst.Arg(
            value,
            keyword=cst.Name(self.arg.keyword.value),
            equal=cst.AssignEqual(
                whitespace_before=no_space, whitespace_after=no_space
            ),
        )


class _Rewrite(cst.CSTTransformer):
    """Write the chosen small statements and calls as their replacements."""

    def __init__(
        self,
        statements: Mapping[cst.CSTNode, list[cst.BaseSmallStatement]],
        calls: Mapping[cst.CSTNode, cst.Call],
    ) -> None:
        self.statements = statements
        self.calls = calls

    def leave_SimpleStatementLine(
        self,
        original_node: cst.SimpleStatementLine,
        updated_node: cst.SimpleStatementLine,
    ) -> cst.SimpleStatementLine:
        return updated_node.with_changes(
            body=self._body(original_node.body, updated_node.body)
        )

    def leave_SimpleStatementSuite(
        self,
        original_node: cst.SimpleStatementSuite,
        updated_node: cst.SimpleStatementSuite,
    ) -> cst.SimpleStatementSuite:
        return updated_node.with_changes(
            body=self._body(original_node.body, updated_node.body)
        )

    def _body(
        self,
        original: Sequence[cst.BaseSmallStatement],
        updated: Sequence[cst.BaseSmallStatement],
    ) -> list[cst.BaseSmallStatement]:
        body: list[cst.BaseSmallStatement] = []
        for before, after in zip(original, updated, strict=True):
            replacement = self.statements.get(before)
            if replacement is None:
                body.append(after)
                continue
            *bound, last = replacement
            semicolon = cst.Semicolon(whitespace_after=cst.SimpleWhitespace(" "))
            body += [b.with_changes(semicolon=semicolon) for b in bound]
            body.append(last.with_changes(semicolon=after.semicolon))
        return body

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        closure = self.calls.get(original_node)
        if closure is None:
            return updated_node
        func = cst.Subscript(
            closure, [cst.SubscriptElement(cst.Index(cst.Integer("1")))]
        )
        return updated_node.with_changes(func=func)


def _bound_anywhere(function: cst.FunctionDef) -> set[str]:
    """The names `function` binds: its parameters, and anything its body or the
    scopes nested in it bind."""
    return bound_anywhere(function.params, function.body)


def check_draws(parsed: ParsedModule, composed: Composed) -> list[Diagnostic]:
    """S2S121 where a kept closure's differentiator draws random numbers: backward
    recomputes its context to call the closure, and would draw different ones."""
    by_name = {d.name: d for d in parsed.differentiators}
    found = []
    for composition in composed.compositions:
        callee = by_name.get(composition.callee)
        if callee is None:
            continue
        draw = draws(callee.statements, callee.qualified_names, parsed)
        if draw is None:
            continue
        line = line_text(parsed.lines, composition.line)
        found.append(
            Diagnostic(
                "S2S121",
                f"`{composition.closure}`, the closure of `{composition.callee}`, is "
                f"called in backward, which recomputes `{composition.callee}`'s "
                f"context to call it; but `{composition.callee}` draws random numbers "
                f"(`{draw.rsplit('.', 1)[-1]}`): the recomputation would draw "
                "different ones",
                parsed.path,
                composition.line,
                composition.column,
                line,
                f"draw the random part in `{composition.caller}` and pass it to "
                f"`{composition.callee}` (`mask = torch.rand_like(x) > p`)",
            )
        )
    return found


def draws_here(call: cst.Call, name: str) -> bool:
    """Whether `call` of the random op `name` draws: not where its `training`
    (`train`) flag is a literal False, by keyword or by position
    (`F.dropout(x, p, training=False)`, `torch.dropout(x, p, False)`), which hands
    its input back unchanged."""
    if any(a.star for a in call.args):
        return True
    method = name.startswith("torch.Tensor.")  # `x.dropout(p, False)`: x is `input`
    positional = [a.value for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    for signature in opfacts.signatures(name):
        plain = [p.name for p in signature.params if not p.keyword_only]
        for flag in ("training", "train"):
            given = keywords.get(flag)
            if given is None and flag in plain:
                at = plain.index(flag) - method
                given = positional[at] if 0 <= at < len(positional) else None
            if given is not None and is_name(given, "False"):
                return False
    return True


def draws(
    statements: Sequence[cst.CSTNode],
    qualified: Mapping[cst.CSTNode, str],
    parsed: ParsedModule,
    seen: set[str] | None = None,
    depth: int = 0,
) -> str | None:
    """The random op `statements` run, themselves or in the module's helpers and
    differentiators they call (four calls deep); None if none."""
    seen = set() if seen is None else seen
    for statement in statements:
        for call in findall(statement, cst.Call):
            func = call.func
            name = qualified.get(func) if dotted(func) else None
            if name is None and isinstance(func, cst.Attribute):
                name = f"torch.Tensor.{func.attr.value}"
            if name is not None and opfacts.is_random(name) and draws_here(call, name):
                return name
            if name is not None and name.startswith("torch."):
                continue
            if not isinstance(func, cst.Name) or func.value in seen or depth >= 4:
                continue
            seen.add(func.value)
            helper = parsed.helpers.get(func.value)
            sibling = next(
                (d for d in parsed.differentiators if d.name == func.value), None
            )
            body: Sequence[cst.CSTNode] = ()
            names: Mapping[cst.CSTNode, str] = {}
            if helper is not None:
                body, names = (helper.node.body,), helper.qualified_names
            elif sibling is not None:
                body, names = sibling.statements, sibling.qualified_names
            draw = draws(body, names, parsed, seen, depth + 1)
            if draw is not None:
                return draw
    return None
