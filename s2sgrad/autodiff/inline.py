"""Inline a derivative rule's backward at a call site.

Takes a `Rule`, the call's arguments bound to the rule's parameters, the incoming
gradient and the call's result; returns the statements and per-parameter gradient
expressions with the rule's names replaced (parameters by the arguments, locals by fresh
names), statements no needed entry reads dropped, and tests on constants folded.
Invariant: the returned code reads only the argument expressions, the gradient, the
result, torch, math and builtins.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.registry import Rule, is_tensor_test
from s2sgrad.cst import (
    NameRewriter,
    as_expression,
    as_statement,
    assigned_name,
    is_name,
    nodes,
    sole,
    statements,
    walk,
)
from s2sgrad.names import NameAllocator

_ATOMS = (
    cst.Name,
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.Attribute,
    cst.Subscript,
    cst.Call,
)


def parenthesize(node: cst.BaseExpression) -> cst.BaseExpression:
    """Wrap `node` in parentheses unless it is atomic where it is substituted."""
    if isinstance(node, _ATOMS) or node.lpar:
        return node
    if isinstance(node, cst.UnaryOperation) and isinstance(
        node.expression, (cst.Integer, cst.Float)
    ):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class _Names(cst.CSTVisitor):
    """Collect the names a node reads and the names its targets bind."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.bound: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.read.add(node.value)

    def _target(self, target: cst.CSTNode) -> None:
        inner = _Names()
        walk(target, inner)
        self.bound |= inner.read

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._target(node.target)


@functools.lru_cache(maxsize=8192)
def _names(node: cst.CSTNode) -> tuple[frozenset[str], frozenset[str]]:
    """Return (names read, names bound) of a node; rule nodes are asked many times."""
    visitor = _Names()
    walk(node, visitor)
    return frozenset(visitor.read), frozenset(visitor.bound)


def bound_names(nodes: Sequence[cst.CSTNode]) -> set[str]:
    """Names a piece of code binds: assignment and comprehension targets."""
    return set().union(*(_names(node)[1] for node in nodes))


class _Substitute(NameRewriter):
    """Replace names by expressions."""

    def __init__(self, mapping: Mapping[str, cst.BaseExpression]) -> None:
        self.mapping = mapping

    def rewrite(self, name: str) -> cst.BaseExpression | None:
        return self.mapping.get(name)


def substitute(
    node: cst.CSTNode, mapping: Mapping[str, cst.BaseExpression]
) -> cst.CSTNode:
    result = node.visit(_Substitute(mapping))
    assert isinstance(result, cst.CSTNode)
    return result


def names_read(node: cst.CSTNode) -> set[str]:
    """Return the names a node reads (and, for simplicity, the names it binds)."""
    return set(_names(node)[0])


_reads = names_read


_FOLDABLE = (
    ast.Expression,
    ast.Constant,
    ast.Compare,
    ast.BoolOp,
    ast.UnaryOp,
    ast.Tuple,
    ast.List,
    ast.Is,
    ast.IsNot,
    ast.Not,
    ast.And,
    ast.Or,
    ast.Eq,
    ast.NotEq,
    ast.Load,
    ast.USub,
    ast.In,
    ast.NotIn,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Subscript,
)


def constant_truth(test: cst.BaseExpression) -> bool | None:
    """Evaluate a test made only of literals (`None is None`, `not True`), else None."""
    return _truth(cst.Module([]).code_for_node(test))


@functools.lru_cache(maxsize=4096)
def _truth(code: str) -> bool | None:
    """`constant_truth` of the test written `code` (rules ask the same ones again)."""
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except SyntaxError:
        return None
    if not all(
        isinstance(n, _FOLDABLE) or _type_test_part(n) for n in ast.walk(tree)
    ) or any(
        isinstance(n, ast.Call) and not (_type_test(n) or _length(n))
        for n in ast.walk(tree)
    ):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # `1 is None` is what we fold
        code_object = compile(tree, "<test>", "eval")
    namespace = {"__builtins__": {}, "isinstance": isinstance, "len": len, **_TYPES}
    try:
        return bool(eval(code_object, namespace, {}))  # noqa: S307
    except (TypeError, IndexError, KeyError):  # `(2, 0)[5]`: left to run time
        return None


#: The builtin types a rule's backward tests a literal argument against
#: (`isinstance(dim, int)` where the call wrote `x.sum(1)`).
_TYPES: dict[str, type] = {
    t.__name__: t for t in (bool, int, float, complex, str, tuple, list, dict, set)
}


def _type_test(node: ast.Call) -> bool:
    """Whether `node` is `isinstance(literal, builtin type or tuple of them)`."""
    if not (
        isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and not node.keywords
    ):
        return False
    value, kinds = node.args
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return not any(
        isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(value)
    ) and all(isinstance(n, ast.Name) and n.id in _TYPES for n in names)


def _length(node: ast.Call) -> bool:
    """Whether `node` is `len(literal)` (`len((2, 0, 1))`, a rule's varargs)."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id == "len"
        and len(node.args) == 1
        and not node.keywords
        and not any(isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(node.args[0]))
    )


def _type_test_part(node: ast.AST) -> bool:
    """A node a folded `isinstance` or `len` call is made of (checked by
    `_type_test` and `_length`)."""
    return isinstance(node, (ast.Call, ast.Name)) and (
        not isinstance(node, ast.Name) or node.id in (*_TYPES, "isinstance", "len")
    )


class _Unelif(cst.CSTTransformer):
    """Write `elif` as `else: if`, so folding may replace any `if` by its branch."""

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if isinstance(updated_node.orelse, cst.If):
            return updated_node.with_changes(
                orelse=cst.Else(cst.IndentedBlock([updated_node.orelse]))
            )
        return updated_node


class _Fold(cst.CSTTransformer):
    """Keep only the taken branch of `if`s and conditional expressions on constants."""

    def leave_IfExp(
        self, original_node: cst.IfExp, updated_node: cst.IfExp
    ) -> cst.BaseExpression:
        truth = constant_truth(updated_node.test)
        if truth is None:
            return updated_node
        return parenthesize(updated_node.body if truth else updated_node.orelse)

    def leave_If(
        self, original_node: cst.If, updated_node: cst.If
    ) -> (
        cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel
    ):
        truth = constant_truth(updated_node.test)
        if truth is None:
            return updated_node
        if truth:
            return cst.FlattenSentinel(statements(updated_node.body))
        orelse = updated_node.orelse
        if orelse is None:
            return cst.RemovalSentinel.REMOVE
        if isinstance(orelse, cst.If):
            return orelse
        return cst.FlattenSentinel(statements(orelse.body))


class _TypeTests(cst.CSTTransformer):
    """Write `isinstance(p, torch.Tensor)` as `True` or `False` where `known` says."""

    def __init__(self, known: Mapping[str, bool]) -> None:
        self.known = known

    def leave_Call(
        self, original_node: cst.Call, updated_node: cst.Call
    ) -> cst.BaseExpression:
        if not is_tensor_test(updated_node):
            return updated_node
        tested = updated_node.args[0].value
        assert isinstance(tested, cst.Name)
        if tested.value not in self.known:
            return updated_node
        return cst.Name("True" if self.known[tested.value] else "False")


def settled(rule: Rule, known: Mapping[str, bool]) -> Rule:
    """`rule` with its type tests on the parameters in `known` settled and folded.

    `known` says, per parameter, whether the call's argument is a tensor (True) or a
    Python number (False); a rule written for both (`pow_`) then keeps only the
    branch the call takes, which also spares reading what only the other one reads.
    """
    known = {p: k for p, k in known.items() if p in rule.type_tested}
    if not known:
        return rule
    tests = _TypeTests(known)
    body: list[cst.BaseStatement] = []
    for statement in rule.body:
        new = _fold(_unelif(as_statement(statement.visit(tests))))
        if isinstance(new, cst.FlattenSentinel):
            body += [as_statement(n) for n in new.nodes]
        elif isinstance(new, cst.BaseStatement):
            body.append(new)
    entries = tuple(
        None if e is None else as_expression(_fold(as_expression(e.visit(tests))))
        for e in rule.entries
    )
    return dataclasses.replace(
        rule,
        body=tuple(body),
        entries=entries,
        type_tested=rule.type_tested - set(known),
    )


@dataclass(frozen=True)
class Inlined:
    statements: tuple[cst.BaseStatement, ...]
    #: Per rule parameter: the gradient expression, or None when not asked for.
    entries: tuple[cst.BaseExpression | None, ...]


def inline(
    rule: Rule,
    args: Mapping[str, cst.BaseExpression],
    grad: cst.BaseExpression,
    out: cst.BaseExpression,
    wanted: set[int],
    names: NameAllocator,
    written: Mapping[str, cst.BaseExpression] | None = None,
) -> Inlined:
    """Inline `rule`'s backward for the parameters at the `wanted` positions.

    `written` gives the arguments as the source wrote them, to name a repeated one.
    """
    mapping: dict[str, cst.BaseExpression] = {
        p: parenthesize(a) for p, a in args.items()
    }
    mapping[rule.grad] = grad
    if rule.out is not None:
        mapping[rule.out] = parenthesize(out)
    entries = [e if i in wanted else None for i, e in enumerate(rule.entries)]
    needed = set().union(*(_reads(e) for e in entries if e is not None))
    body = _needed_statements(rule.body, needed)
    for local in sorted(bound_names(body)):
        mapping[local] = cst.Name(names.fresh(local))
    statements: list[cst.BaseStatement] = _bind_repeated(
        mapping, [*body, *(e for e in entries if e is not None)], names, written or {}
    )
    for statement in body:
        new = _fold(_unelif(_inserted(statement, mapping)))
        if isinstance(new, cst.FlattenSentinel):
            statements += [as_statement(n) for n in new.nodes]
        elif isinstance(new, cst.BaseStatement):
            statements.append(new)
    statements, aliases = _drop_aliases(statements)
    out_entries = tuple(
        (
            None
            if e is None
            else as_expression(
                _renamed(as_expression(_fold(_inserted(e, mapping))), aliases)
            )
        )
        for e in entries
    )
    return Inlined(
        tuple(as_statement(_renamed(s, aliases)) for s in statements), out_entries
    )


# Each pass below rebuilds every node it passes, and inlining runs for every step of
# every differentiator: a pass that cannot change a node (no `elif`, no `if` to
# fold, no alias to rename) is not run, which gives the same code. A pass also left
# no node shared between two places or with the arguments (later stages find nodes
# by identity): `_inserted` copies each argument where it puts it, so that holds
# whichever passes run.


class _Insert(_Substitute):
    """`_Substitute` that puts a copy of the expression at each place."""

    def rewrite(self, name: str) -> cst.BaseExpression | None:
        found = self.mapping.get(name)
        return None if found is None else found.deep_clone()


def _inserted(
    node: cst.CSTNode, mapping: Mapping[str, cst.BaseExpression]
) -> cst.CSTNode:
    """`substitute(node, mapping)` with a fresh copy of the expression at each use."""
    result = node.visit(_Insert(mapping))
    assert isinstance(result, cst.CSTNode)
    return result


def _unelif(node: cst.CSTNode) -> cst.BaseStatement:
    """`node` with `_Unelif` applied, where it has an `elif`."""
    if any(isinstance(n, cst.If) and isinstance(n.orelse, cst.If) for n in nodes(node)):
        return as_statement(node.visit(_Unelif()))
    return as_statement(node)


def _fold(
    node: cst.CSTNode,
) -> cst.CSTNode | cst.FlattenSentinel[cst.CSTNode] | cst.RemovalSentinel:
    """`node` with `_Fold` applied, where it has an `if` or a conditional expression."""
    if any(isinstance(n, (cst.If, cst.IfExp)) for n in nodes(node)):
        return node.visit(_Fold())
    return node


def _renamed(
    node: cst.CSTNode, aliases: Mapping[str, cst.BaseExpression]
) -> cst.CSTNode:
    """`substitute(node, aliases)`, where there are aliases."""
    return substitute(node, aliases) if aliases else node


class _CountReads(cst.CSTVisitor):
    """Count how often each name is read: the names a `NameRewriter` is asked
    about (never `.attr`; a `keyword=` name counts, as it is asked about too)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] = self.counts.get(node.value, 0) + 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)
        return False


def _cheap(node: cst.BaseExpression) -> bool:
    """A value as cheap to repeat as a name: a name, a literal, `x.attr`, `(1, x)`."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.UnaryOperation):
        return _cheap(node.expression)
    if isinstance(node, cst.Attribute):
        return isinstance(node.value, cst.Name)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(_cheap(e.value) for e in node.elements)
    return False


def _let_name(param: str, value: cst.BaseExpression) -> str:
    """Name a bound argument after what it computes: `k.transpose(...)` -> k_transpose."""
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        base = value.func.value
        if isinstance(base, cst.Name) and not base.value.startswith("__"):
            if base.value not in ("torch", "F", "math"):
                return f"{base.value}_{value.func.attr.value}"
    return param


def _bind_repeated(
    mapping: dict[str, cst.BaseExpression],
    code: Sequence[cst.CSTNode],
    names: NameAllocator,
    written: Mapping[str, cst.BaseExpression],
) -> list[cst.BaseStatement]:
    """Bind each argument the rule reads more than once to a local, once.

    An argument is a forward expression recomputed in backward (a view such as
    `k.transpose(-2, -1)`, or a cheap elementwise op); substituted as is it would be
    written, and evaluated, at every use.
    """
    counter = _CountReads()
    for node in code:
        walk(node, counter)
    lets: list[cst.BaseStatement] = []
    for param, value in list(mapping.items()):
        if counter.counts.get(param, 0) < 2 or _cheap(value):
            continue
        name = cst.Name(names.fresh(_let_name(param, written.get(param, value))))
        bare = value.with_changes(lpar=[], rpar=[])
        lets.append(
            cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(name)], bare)])
        )
        mapping[param] = name
    return lets


def rule_reads(rule: Rule, wanted: set[int]) -> set[str]:
    """Names the rule's backward reads to compute the wanted entries."""
    entries = [e for i, e in enumerate(rule.entries) if i in wanted and e is not None]
    needed = set().union(*(_reads(e) for e in entries))
    for statement in _needed_statements(rule.body, needed):
        needed |= _reads(statement)
    return needed


def _drop_aliases(
    statements: list[cst.BaseStatement],
) -> tuple[list[cst.BaseStatement], dict[str, cst.BaseExpression]]:
    """Drop top-level `local = other_name` lines left by folding, renaming their uses,
    and `local = literal` lines (`over = -1`, where a rule chose a dim) for a local
    bound there only, writing the literal at its uses."""
    bound_once = _bound_once(statements)
    aliases: dict[str, cst.BaseExpression] = {}
    kept = []
    for statement in statements:
        # A line `local = other_name` or `local = literal`.
        assign = sole(statement, cst.Assign)
        target = assigned_name(assign)
        if (
            assign is not None
            and target is not None
            and (_is_literal(assign.value) or is_name(assign.value))
        ):
            if isinstance(assign.value, cst.Name):
                aliases[target.value] = aliases.get(assign.value.value, assign.value)
                continue
            if target.value in bound_once:
                aliases[target.value] = assign.value
                continue
        kept.append(as_statement(substitute(statement, aliases)))
    return kept, aliases


_NUMBERS = (cst.Integer, cst.Float)


def _is_literal(node: cst.BaseExpression) -> bool:
    """Whether `node` is a literal a rule's local may stand for: a number (negative
    too), a string, a bool or None."""
    if isinstance(node, cst.UnaryOperation):
        return isinstance(node.operator, cst.Minus) and isinstance(
            node.expression, _NUMBERS
        )
    return isinstance(node, (*_NUMBERS, cst.SimpleString)) or (
        isinstance(node, cst.Name) and node.value in ("True", "False", "None")
    )


def _bound_once(statements: Sequence[cst.BaseStatement]) -> set[str]:
    """The names `statements` bind exactly once, anywhere in them."""
    counts: dict[str, int] = {}
    for statement in statements:
        for node in nodes(statement):
            if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
                target: cst.CSTNode = node.target
            elif isinstance(node, (cst.For, cst.CompFor)):
                target = node.target
            else:
                continue
            # Every name in a target counts (`t[i] = v` counts `t` and `i`): a name
            # counted once too often is only kept.
            for name in nodes(target):
                if isinstance(name, cst.Name):
                    counts[name.value] = counts.get(name.value, 0) + 1
    return {name for name, count in counts.items() if count == 1}


def _needed_statements(
    body: Sequence[cst.BaseStatement], needed: set[str]
) -> list[cst.BaseStatement]:
    """Keep the statements that bind a name the needed entries read, transitively."""
    kept: list[cst.BaseStatement] = []
    wanted = set(needed)
    for statement in reversed(body):
        if bound_names([statement]) & wanted:
            kept.append(statement)
            wanted |= _reads(statement)
    return list(reversed(kept))
