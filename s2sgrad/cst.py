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
