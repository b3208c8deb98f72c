"""Forward's statements as the generated forward runs them: with what the VJP reads.

Takes forward's statements, their versioned program and the lines the plan adds
(`ForwardLines`): snapshots of values that forward rebinds later (`h_1 = h`, right after
the statement that computes `h`), sub-expressions named before the statement that
computes them (`scores_matmul = q @ k.transpose(-2, -1)`), tests of `if`s bound to a
name that backward reads (`cond = bool(h.sum() > 0)`, then `if cond:`), and names
bound to None before a top-level statement where some path through it leaves them
unbound; returns the statements with those lines in place. A snapshot or a named sub-expression lands
inside the branch that computes its value, wherever that is nested; a statement line
holding several statements (`a = x.exp(); a = a.sin()`) is cut where one goes between.
Invariant: a line lands where its value exists, and every name the context reads is
bound on every path through forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from s2sgrad.autodiff.program import Assign, Branch, Program, Step
from s2sgrad.cst import as_expression, statements

#: The key of the snapshots taken before forward's first statement (of parameters).
START = 0


@dataclass
class ForwardLines:
    """The lines the generated VJP needs forward to run, and where they go."""

    #: Snapshots after a statement, by the id of its node (`Version.after`), or at
    #: `START`: (name, expression).
    snapshots: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    #: Names bound to None before a top-level statement, by its index: the VJP reads
    #: them where a branch of that statement binds them, and the context at the end.
    defaults: dict[int, list[str]] = field(default_factory=dict)
    #: Names whose augmented assignment must become out-of-place (a snapshot aliases
    #: the earlier value).
    aliased: set[str] = field(default_factory=set)
    #: Sub-expressions named before a statement, by the id of its (small) statement.
    hoists: dict[int, list[tuple[str, cst.BaseExpression]]] = field(
        default_factory=dict
    )
    #: Tests of `if`s bound to a name first, by the id of the test: the name, and
    #: whether the test may be a tensor (its truth is kept, `bool(...)`).
    conditions: dict[int, tuple[str, bool]] = field(default_factory=dict)

    def snapshot(self, after: cst.CSTNode | None, name: str, code: str) -> None:
        """Bind `name = code` right after `after` (before everything for None)."""
        key = START if after is None else id(after)
        self.snapshots.setdefault(key, []).append((name, code))

    def default(self, top: int, name: str) -> None:
        """Bind `name = None` before top-level statement `top` (once)."""
        names = self.defaults.setdefault(top, [])
        if name not in names:
            names.append(name)


def with_lines(
    body: Sequence[cst.BaseStatement], lines: ForwardLines, program: Program
) -> list[cst.BaseStatement]:
    """Forward's statements with `lines` in place."""
    emitter = _Emitter(lines, program)
    out = emitter.snapshots(START)
    for index, statement in enumerate(body):
        out += [
            _line(f"{name} = None  # unless a branch below binds it: the VJP reads it")
            for name in lines.defaults.get(index, [])
        ]
        out += emitter.statement(statement)
    return out


def _line(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


class _Emitter:
    def __init__(self, lines: ForwardLines, program: Program) -> None:
        self.lines = lines
        names = {
            id(node): name
            for hoisted in lines.hoists.values()
            for name, node in hoisted
        }
        self.replace = _ReplaceById(names)
        #: Augmented assignments by the id of their small statement.
        self.augmented = {
            id(s.target.after): s for s in _assigns(program.steps) if s.augmented
        }

    def snapshots(self, key: int) -> list[cst.BaseStatement]:
        return [
            _line(f"{name} = {code}  # read by the generated VJP")
            for name, code in self.lines.snapshots.get(key, [])
        ]

    def hoisted(self, small: cst.CSTNode) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for name, node in reversed(self.lines.hoists.get(id(small), [])):
            value = node.with_changes(lpar=[], rpar=[]).visit(self.replace.inner(node))
            target = cst.AssignTarget(cst.Name(name))
            out.append(
                cst.SimpleStatementLine([cst.Assign([target], as_expression(value))])
            )
        return out

    def statement(self, node: cst.BaseStatement) -> list[cst.BaseStatement]:
        if isinstance(node, cst.SimpleStatementLine):
            return self.simple(node)
        if isinstance(node, cst.If):
            condition, branch = self.condition(node)
            return [*condition, self.branch(branch), *self.snapshots(id(node))]
        return [node, *self.snapshots(id(node))]

    def condition(self, node: cst.If) -> tuple[list[cst.BaseStatement], cst.If]:
        """`cond = <test>` and the `if` that reads `cond`, where backward reads the
        test's truth by name; else no line and the `if` as it is."""
        named = self.lines.conditions.get(id(node.test))
        if named is None:
            return [], node
        name, tensor = named
        test = node.test.with_changes(lpar=[], rpar=[])
        value = cst.Call(cst.Name("bool"), [cst.Arg(test)]) if tensor else test
        bind = cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(name))], value)]
        )
        return [bind], node.with_changes(test=cst.Name(name))

    def simple(self, node: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        """The line's statements, with lines before and after each where they go."""
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseSmallStatement] = []
        first = True

        def flush(last: bool) -> None:
            nonlocal first, run
            if not run:
                return
            piece = node.with_changes(body=run)
            if not first:
                piece = piece.with_changes(leading_lines=[])
            if not last:
                piece = piece.with_changes(trailing_whitespace=cst.TrailingWhitespace())
            out.append(piece)
            first, run = False, []

        for small in node.body:
            before = self.hoisted(small)
            if before:
                flush(False)
                out.extend(before)
            run.append(self.small(small))
            after = self.snapshots(id(small))
            if after:
                flush(small is node.body[-1])
                out.extend(after)
        flush(True)
        return out

    def small(self, small: cst.BaseSmallStatement) -> cst.BaseSmallStatement:
        # Out of place first: the step is found by identity, which visiting loses.
        step = self.augmented.get(id(small))
        if step is not None and step.target.name in self.lines.aliased:
            assert isinstance(small, cst.AugAssign)
            small = cst.Assign([cst.AssignTarget(small.target)], step.value)
        new = small.visit(self.replace)
        assert isinstance(new, cst.BaseSmallStatement)
        return new.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)

    def branch(self, node: cst.If) -> cst.If:
        orelse = node.orelse
        if isinstance(orelse, cst.If):
            condition, inner = self.condition(orelse)
            if condition:
                # `elif` runs its test only where the tests above failed: so does
                # the line that names it, in an `else`.
                nested = [*condition, self.branch(inner.with_changes(leading_lines=[]))]
                orelse = cst.Else(cst.IndentedBlock(nested))
            else:
                orelse = self.branch(orelse)
        elif isinstance(orelse, cst.Else):
            orelse = orelse.with_changes(body=self.block(orelse.body))
        return node.with_changes(body=self.block(node.body), orelse=orelse)

    def block(self, suite: cst.BaseSuite) -> cst.BaseSuite:
        body = [s for statement in statements(suite) for s in self.statement(statement)]
        if isinstance(suite, cst.IndentedBlock):
            return suite.with_changes(body=body)
        return cst.IndentedBlock(body)


class _ReplaceById(cst.CSTTransformer):
    """Replace hoisted sub-expressions (by identity) with the names that hold them."""

    def __init__(self, names: dict[int, str], skip: cst.CSTNode | None = None) -> None:
        self.names = names
        self.skip = skip

    def inner(self, node: cst.CSTNode) -> _ReplaceById:
        return _ReplaceById(self.names, skip=node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        name = self.names.get(id(original_node))
        if name is not None and original_node is not self.skip:
            return cst.Name(name)
        return updated_node


def _assigns(steps: Sequence[Step]) -> list[Assign]:
    found: list[Assign] = []
    for step in steps:
        if isinstance(step, Assign):
            found.append(step)
        elif isinstance(step, Branch):
            found += _assigns(step.body) + _assigns(step.orelse)
    return found
