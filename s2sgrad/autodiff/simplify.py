"""Simplify generated reverse-mode code, as a careful engineer would write it.

Takes the VJP blocks `plan.py` assembled (rules inlined, forward reads resolved) and the
accumulators known to be None when they start; returns equivalent blocks. Each rewrite
is small and tested on its own (tests/test_simplify.py), as tangent and black test
their transforms:

- `fold`: arithmetic on literals (`3 - 1` -> `2`), `e ** 1` and `--e`, boolean tests
  settled by a literal (`x is None or True`), and the branches and conditional
  expressions they decide;
- `first_contributions`: `acc = _accumulate(acc, e)` where `acc` is still None is
  `acc = e`;
- `merge_repeats`: the same contribution added twice in a row is added once, doubled;
- `forward_copies`: `t = e` then `acc = t` (nothing else reads `t`) is `acc = e`, and
  `t = e` then `acc = _accumulate(acc, t)` is `acc = _accumulate(acc, e)`;
- `propagate_copies`: `a = b` is dropped and `a` read as `b`, where `a` is bound there
  only and `b` is not rebound after it.

Shape facts (no-op `sum_to_size`, shapes read off saved tensors) are applied where the
facts are known, while the rules are inlined (`vjp.py`, `plan.py`).
"""

from __future__ import annotations

import ast
import operator
import warnings
from collections.abc import Callable, Collection, Sequence
from functools import partial

import libcst as cst

from s2sgrad.cst import (
    as_expression,
    as_statement,
    assigned_name,
    calls_name,
    findall,
    is_name,
    name_counts,
    sole,
    spelled,
    statements,
    walk,
)

ACCUMULATE = "_accumulate"


def simplify(
    blocks: Sequence[cst.BaseStatement],
    none: set[str],
    keep: Collection[str] = (),
) -> list[cst.BaseStatement]:
    """Apply every rewrite to the blocks; `none` are the accumulators still None,
    `keep` the names read after the blocks (results, keyword parameters)."""
    folded = [s for block in blocks for s in fold(block)]
    merged = first_contributions(merge_repeats(folded), set(none))
    return propagate_copies(forward_copies(merged, keep), keep)


# -- fold -----------------------------------------------------------------------------


def fold(statement: cst.BaseStatement) -> list[cst.BaseStatement]:
    """Fold constants and settled tests; a settled `if` becomes the branch taken."""
    finder = _Foldable()
    walk(statement, finder)
    if not finder.found:
        # `_Fold` would rebuild every node and change none: where no node can be
        # folded as it stands, none can once its children are (they are the same).
        return [statement]
    new = statement.visit(_Fold())
    if isinstance(new, cst.FlattenSentinel):
        return [as_statement(n) for n in new.nodes]
    if isinstance(new, cst.RemovalSentinel):
        return []
    return [as_statement(new)]


def _number(node: cst.BaseExpression) -> float | int | None:
    """The value of a numeric literal (`2`, `-0.5`, `(1)`), or None."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return node.evaluated_value
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, (cst.Integer, cst.Float))
    ):
        return -node.expression.evaluated_value
    return None


def _literal(value: float | int) -> cst.BaseExpression:
    text = repr(value)
    if value < 0:
        return cst.UnaryOperation(cst.Minus(), _literal(-value))
    return cst.Integer(text) if isinstance(value, int) else cst.Float(text)


_ARITHMETIC: dict[type[cst.BaseBinaryOp], Callable[[float, float], float]] = {
    cst.Add: operator.add,
    cst.Subtract: operator.sub,
    cst.Multiply: operator.mul,
}


def _truth(node: cst.BaseExpression) -> bool | None:
    """Whether a test is settled: a literal, or an `or`/`and` a literal decides."""
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = _truth(node.expression)
        return None if inner is None else not inner
    if isinstance(node, cst.BooleanOperation):
        left, right = _truth(node.left), _truth(node.right)
        if isinstance(node.operator, cst.Or):
            if left is True or right is True:
                return True
            if left is False and right is False:
                return False
        else:
            if left is False or right is False:
                return False
            if left is True and right is True:
                return True
        return None
    return _compare(node)


def _compare(node: cst.BaseExpression) -> bool | None:
    """A comparison of literals (`None is None`, `1 == 1`)."""
    if not isinstance(node, cst.Comparison):
        return None
    code = cst.Module([]).code_for_node(node)
    try:
        tree = ast.parse(code.strip(), mode="eval")
    except SyntaxError:
        return None
    allowed = (
        ast.Expression, ast.Constant, ast.Compare, ast.UnaryOp, ast.USub, ast.Is,
        ast.IsNot, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Load,
    )  # fmt: skip
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # `1 is None` is what we fold
        return bool(
            eval(compile(tree, "<test>", "eval"), {"__builtins__": {}}, {})
        )  # noqa: S307


class _Fold(cst.CSTTransformer):
    def leave_BinaryOperation(
        self, original_node: cst.BinaryOperation, updated_node: cst.BinaryOperation
    ) -> cst.BaseExpression:
        left, right = _number(updated_node.left), _number(updated_node.right)
        op = type(updated_node.operator)
        if left is not None and right is not None and op in _ARITHMETIC:
            folded = _ARITHMETIC[op](left, right)
            if folded >= 0:
                return _literal(folded)  # a plain literal needs no parentheses
            return _keep_parens(updated_node, _literal(folded))
        # `e ** 1` is `e`; `e * 1.0` is not dropped: it turns a mask into floats.
        if (
            op is cst.Power
            and right == 1
            and isinstance(updated_node.right, cst.Integer)
        ):
            return _keep_parens(updated_node, updated_node.left)
        return updated_node

    def leave_UnaryOperation(
        self, original_node: cst.UnaryOperation, updated_node: cst.UnaryOperation
    ) -> cst.BaseExpression:
        inner = updated_node.expression
        if (
            isinstance(updated_node.operator, cst.Minus)
            and isinstance(inner, cst.UnaryOperation)
            and isinstance(inner.operator, cst.Minus)
        ):
            return _keep_parens(updated_node, inner.expression)
        return updated_node

    def leave_BooleanOperation(
        self, original_node: cst.BooleanOperation, updated_node: cst.BooleanOperation
    ) -> cst.BaseExpression:
        truth = _truth(updated_node)
        if truth is None:
            return updated_node
        return cst.Name("True" if truth else "False")

    def leave_IfExp(
        self, original_node: cst.IfExp, updated_node: cst.IfExp
    ) -> cst.BaseExpression:
        truth = _truth(updated_node.test)
        if truth is None:
            return updated_node
        kept = updated_node.body if truth else updated_node.orelse
        return _keep_parens(updated_node, kept)

    def leave_If(
        self, original_node: cst.If, updated_node: cst.If
    ) -> (
        cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel
    ):
        truth = _truth(updated_node.test)
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


class _Foldable(cst.CSTVisitor):
    """Find a node `_Fold` would replace (the tests of its `leave_` methods)."""

    def __init__(self) -> None:
        self.found = False

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        left, right = _number(node.left), _number(node.right)
        op = type(node.operator)
        if left is not None and right is not None and op in _ARITHMETIC:
            self.found = True
        elif op is cst.Power and right == 1 and isinstance(node.right, cst.Integer):
            self.found = True

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        inner = node.expression
        if (
            isinstance(node.operator, cst.Minus)
            and isinstance(inner, cst.UnaryOperation)
            and isinstance(inner.operator, cst.Minus)
        ):
            self.found = True

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        if _truth(node) is not None:
            self.found = True

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if _truth(node.test) is not None:
            self.found = True

    def visit_If(self, node: cst.If) -> None:
        if _truth(node.test) is not None:
            self.found = True


def _keep_parens(
    outer: cst.BaseExpression, inner: cst.BaseExpression
) -> cst.BaseExpression:
    """`inner` in `outer`'s place: parenthesized when `outer` was, or when needed."""
    if outer.lpar and not inner.lpar:
        return inner.with_changes(lpar=outer.lpar, rpar=outer.rpar)
    if isinstance(inner, (cst.BinaryOperation, cst.IfExp, cst.BooleanOperation)):
        if not inner.lpar:
            return inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return inner


def _each_block(
    statement: cst.If,
    rewrite: Callable[[list[cst.BaseStatement]], list[cst.BaseStatement]],
) -> cst.If:
    """`statement` with `rewrite` applied to each of its blocks: the body, each
    `elif`'s and the `else`. Each is straight-line code of its own (the VJP of a
    branch of forward), run or not as a whole."""
    orelse = statement.orelse
    if isinstance(orelse, cst.If):
        orelse = _each_block(orelse, rewrite)
    elif isinstance(orelse, cst.Else):
        orelse = orelse.with_changes(body=_rewritten(orelse.body, rewrite))
        inner = statements(orelse.body)
        if len(inner) == 1 and isinstance(inner[0], cst.If):
            orelse = inner[0]  # `else: if` left alone in its block reads as `elif`
    return statement.with_changes(
        body=_rewritten(statement.body, rewrite), orelse=orelse
    )


def _rewritten(
    suite: cst.BaseSuite,
    rewrite: Callable[[list[cst.BaseStatement]], list[cst.BaseStatement]],
) -> cst.BaseSuite:
    body = rewrite(statements(suite))
    if isinstance(suite, cst.IndentedBlock):
        return suite.with_changes(body=body)
    return cst.IndentedBlock(body)


# -- first contributions --------------------------------------------------------------


def _contribution(
    statement: cst.BaseStatement,
) -> tuple[str, cst.BaseExpression] | None:
    """(acc, e) of `acc = _accumulate(acc, e)`, or None."""
    assign = sole(statement, cst.Assign)
    if assign is None:
        return None
    target = assigned_name(assign)
    call = assign.value
    # Two arguments of any form (`*e` too), the first a name: the same as `acc`.
    if target is None or not calls_name(call, ACCUMULATE) or len(call.args) != 2:
        return None
    total = call.args[0].value
    if not is_name(total) or target.value != total.value:
        return None
    return target.value, call.args[1].value


def first_contributions(
    body: Sequence[cst.BaseStatement], none: set[str]
) -> list[cst.BaseStatement]:
    """`acc = _accumulate(acc, e)` is `acc = e` where `acc` is still None there.

    Walks straight-line code in order; inside a block (each side of an `if`), an
    accumulator that is None on entry is replaced at its first contribution; after the
    block it may or may not have been set, so it is no longer known to be None.
    """
    out: list[cst.BaseStatement] = []
    for statement in body:
        found = _contribution(statement)
        if found is not None and found[0] in none:
            name, value = found
            assert isinstance(statement, cst.SimpleStatementLine)
            assign = cst.Assign([cst.AssignTarget(cst.Name(name))], value)
            out.append(statement.with_changes(body=[assign]))
            none.discard(name)
            continue
        if isinstance(statement, cst.If):
            # Each block starts from what is None before the `if`.
            out.append(_each_block(statement, partial(_first_in_block, none=none)))
        else:
            out.append(statement)
        none -= _assigned(statement)
    return out


def _first_in_block(
    body: list[cst.BaseStatement], none: set[str]
) -> list[cst.BaseStatement]:
    return first_contributions(body, set(none))


def _assigned(node: cst.CSTNode) -> set[str]:
    """The names assignments in `node` bind (`a` in `a = ...`, `a[i] = ...`)."""
    finder = _Targets()
    walk(node, finder)
    return spelled(*finder.targets) if finder.targets else set()


class _Targets(cst.CSTVisitor):
    """Every `AssignTarget` under a node, as `findall(node, cst.AssignTarget)` finds
    them; it does not descend into expressions, where there are none (they belong
    to `Assign` statements only)."""

    def __init__(self) -> None:
        self.targets: list[cst.AssignTarget] = []

    def visit_Assign(self, node: cst.Assign) -> bool:
        self.targets += node.targets
        return False

    def visit_Expr(self, node: cst.Expr) -> bool:
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> bool:
        return False


# -- repeated contributions -----------------------------------------------------------


def merge_repeats(body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The same contribution added twice in a row (`x * x` sends the same gradient to
    both operands) is added once, doubled."""
    out: list[cst.BaseStatement] = []
    code = cst.Module([]).code_for_node
    for statement in body:
        if isinstance(statement, cst.If):
            statement = _each_block(statement, merge_repeats)
        previous = _contribution(out[-1]) if out else None
        found = _contribution(statement)
        if (
            previous is not None
            and found is not None
            and previous[0] == found[0]
            and code(previous[1]) == code(found[1])
            and not _reads(found[1], found[0])  # the second would see the first
        ):
            doubled = cst.BinaryOperation(
                cst.Float("2.0"), cst.Multiply(), _parenthesized(found[1])
            )
            last = out[-1]
            assert isinstance(last, cst.SimpleStatementLine)
            assign = last.body[0]
            assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
            call = assign.value.with_changes(
                args=[assign.value.args[0], cst.Arg(doubled)]
            )
            out[-1] = last.with_changes(body=[assign.with_changes(value=call)])
            continue
        out.append(statement)
    return out


def _reads(node: cst.CSTNode, name: str) -> bool:
    return bool(findall(node, cst.Name, lambda n: n.value == name))


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    atoms = (cst.Name, cst.Call, cst.Attribute, cst.Subscript, cst.Integer, cst.Float)
    if isinstance(node, atoms) or node.lpar:
        return node
    return as_expression(
        node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    )


# -- copies ---------------------------------------------------------------------------


def _is_copy(statement: cst.BaseStatement) -> bool:
    """Whether a statement is a line `a = b`: one name bound to another."""
    assign = sole(statement, cst.Assign)
    return (
        assign is not None
        and assigned_name(assign) is not None
        and is_name(assign.value)
    )


def _binds(statement: cst.BaseStatement, name: str | None = None) -> bool:
    """Whether a statement is a line `name = ...` (any one name, without `name`)."""
    target = assigned_name(sole(statement, cst.Assign))
    return target is not None and (name is None or target.value == name)


def forward_copies(
    body: Sequence[cst.BaseStatement], keep: Collection[str] = ()
) -> list[cst.BaseStatement]:
    """`t = e` then `acc = t`, where nothing else reads `t`, is `acc = e` (and
    `acc = _accumulate(acc, t)` is `acc = _accumulate(acc, e)`); `keep` are names read
    after `body`, never dropped."""
    reads = name_counts(*body)
    for name in keep:
        reads[name] = reads.get(name, 0) + 1
    return _copies(body, reads)


def _copies(
    body: Sequence[cst.BaseStatement], reads: dict[str, int]
) -> list[cst.BaseStatement]:
    out: list[cst.BaseStatement] = []
    for statement in body:
        if isinstance(statement, cst.If):
            statement = _each_block(statement, lambda b: _copies(b, reads))
        if out and _is_copy(statement) and _binds(out[-1]):
            assert isinstance(statement, cst.SimpleStatementLine)
            copy = statement.body[0]
            previous = out[-1]
            assert isinstance(copy, cst.Assign) and isinstance(copy.value, cst.Name)
            assert isinstance(previous, cst.SimpleStatementLine)
            bound = previous.body[0]
            assert isinstance(bound, cst.Assign)
            target = bound.targets[0].target
            assert isinstance(target, cst.Name)
            # Read here, and written once: a temporary that only carries the value.
            if target.value == copy.value.value and reads.get(target.value) == 2:
                out[-1] = previous.with_changes(
                    body=[bound.with_changes(targets=copy.targets)]
                )
                continue
        carried = _carried(out[-1], statement, reads) if out else None
        if carried is not None:
            out[-1] = carried
            continue
        out.append(statement)
    return out


def _carried(
    previous: cst.BaseStatement, statement: cst.BaseStatement, reads: dict[str, int]
) -> cst.BaseStatement | None:
    """`t = e` then `acc = _accumulate(acc, t)`, where nothing else reads `t`, as
    `acc = _accumulate(acc, e)`; else None."""
    contribution = _contribution(statement)
    if contribution is None or not isinstance(contribution[1], cst.Name):
        return None
    carrier = contribution[1].value
    if reads.get(carrier) != 2 or not _binds(previous, carrier):
        return None
    assert isinstance(previous, cst.SimpleStatementLine)
    assert isinstance(statement, cst.SimpleStatementLine)
    bound, add = previous.body[0], statement.body[0]
    assert isinstance(bound, cst.Assign) and isinstance(add, cst.Assign)
    assert isinstance(add.value, cst.Call)
    value = bound.value.with_changes(lpar=[], rpar=[])
    call = add.value.with_changes(
        args=[add.value.args[0], add.value.args[1].with_changes(value=value)]
    )
    return statement.with_changes(body=[add.with_changes(value=call)])


# -- copy propagation -----------------------------------------------------------------


def propagate_copies(
    body: Sequence[cst.BaseStatement], keep: Collection[str] = ()
) -> list[cst.BaseStatement]:
    """`a = b` (two names) is dropped and the rest of its block reads `b` for `a`, where
    `a` is bound by that statement only, is read nowhere but later in the same block,
    and `b` is bound nowhere after it; `keep` are names read after `body`."""
    everywhere = name_counts(*body)
    return _propagate(list(body), everywhere, set(keep))


def _propagate(
    body: list[cst.BaseStatement], everywhere: dict[str, int], keep: set[str]
) -> list[cst.BaseStatement]:
    out: list[cst.BaseStatement] = []
    k = 0
    while k < len(body):
        statement = body[k]
        if isinstance(statement, cst.If):
            statement = _each_block(
                statement, lambda b: _propagate(b, everywhere, keep)
            )
        rest = body[k + 1 :]
        if _is_copy(statement) and rest:
            assert isinstance(statement, cst.SimpleStatementLine)
            assign = statement.body[0]
            assert isinstance(assign, cst.Assign)
            target, value = assign.targets[0].target, assign.value
            assert isinstance(target, cst.Name) and isinstance(value, cst.Name)
            later = name_counts(*rest)
            if (
                target.value not in keep
                and target.value != value.value
                and everywhere.get(target.value, 0) == 1 + later.get(target.value, 0)
                and target.value not in _assigned_in(rest)
                and value.value not in _assigned_in(rest)
            ):
                swap = {target.value: value}
                body = [
                    *body[: k + 1],
                    *(as_statement(s.visit(_Rename(swap))) for s in rest),
                ]
                k += 1
                continue
        out.append(statement)
        k += 1
    return out


def _assigned_in(body: Sequence[cst.BaseStatement]) -> set[str]:
    return set().union(*(_assigned(s) for s in body)) if body else set()


class _Rename(cst.CSTTransformer):
    def __init__(self, swap: dict[str, cst.Name]) -> None:
        self.swap = swap

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return self.swap.get(updated_node.value, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)
