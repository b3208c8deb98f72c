"""Small typed helpers over libcst shared by every stage.

libcst's `visit` returns a union with its removal and flatten sentinels; the passes here
never remove the node they are called on, so these helpers narrow the type (and check it).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst


def statements(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    """Return the statements of a block, a one-line suite becoming one statement line."""
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    assert isinstance(suite, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(list(suite.body))]


def as_statement(node: object) -> cst.BaseStatement:
    assert isinstance(node, cst.BaseStatement), node
    return node


def as_expression(node: object) -> cst.BaseExpression:
    assert isinstance(node, cst.BaseExpression), node
    return node


def module(body: Sequence[cst.BaseStatement]) -> cst.Module:
    """Return a module of `body`, for code generation and searches."""
    return cst.Module(body=[as_compound_or_line(s) for s in body])


def as_compound_or_line(
    node: cst.BaseStatement,
) -> cst.SimpleStatementLine | cst.BaseCompoundStatement:
    assert isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)), node
    return node


def code(node: cst.CSTNode) -> str:
    """Return the source text of one node."""
    return cst.Module([]).code_for_node(node)


def bound_target(target: cst.BaseExpression) -> set[str]:
    """Return the names an assignment target binds (`a`, `a, (b, *c)`)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(bound_target(e.value) for e in target.elements))
    if isinstance(target, cst.StarredElement):
        return bound_target(target.value)
    return set()


class _Binds(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.names |= bound_target(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.names |= bound_target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.names |= bound_target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self.names |= bound_target(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self.names |= bound_target(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.names |= bound_target(node.target)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        return False


def bound(node: cst.CSTNode) -> set[str]:
    """Return the names a statement binds (not inside nested functions)."""
    visitor = _Binds()
    node.visit(visitor)
    return visitor.names


class NameRewriter(cst.CSTTransformer):
    """Rewrite the names an expression reads, never `.attr` names or `keyword=` names.

    Subclasses implement `rewrite(name)`: the replacement expression, or None to keep it.
    """

    def rewrite(self, name: str) -> cst.BaseExpression | None:
        raise NotImplementedError

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # leave_Attribute rewrites the value, never `.attr`

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(value=original_node.value.visit(self))

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(
        self, original_node: cst.Name, updated_node: cst.Name
    ) -> cst.BaseExpression:
        replacement = self.rewrite(original_node.value)
        return updated_node if replacement is None else replacement


def dotted(node: cst.CSTNode) -> bool:
    """Whether the node is a name or a chain of attributes of a name (`torch.nn.F`).

    Only such a node names a module's function: libcst calls the method in
    `torch.ones(...).tril` "torch.ones.tril", which names nothing.
    """
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


class _Spelled(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.counts: dict[str, int] = {}

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)
        self.counts[node.value] = self.counts.get(node.value, 0) + 1


def spelled(*nodes: cst.CSTNode) -> set[str]:
    """Every `Name` in the nodes, attribute names and keywords included: what
    `m.findall(node, m.Name())` finds, at a fraction of its cost."""
    visitor = _Spelled()
    for node in nodes:
        node.visit(visitor)
    return visitor.names


def name_counts(*nodes: cst.CSTNode) -> dict[str, int]:
    """How many times each `Name` occurs in the nodes (as `spelled` finds them)."""
    visitor = _Spelled()
    for node in nodes:
        node.visit(visitor)
    return visitor.counts
