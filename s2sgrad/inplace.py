"""Forward-side construction: accept, rewrite or reject forward's in-place writes.

Takes a checked `Differentiator` and what the module tells about values; returns the
differentiator with its forward statements rewritten, or raises `TransformError`.
Runs between the frontend and lifting. For each in-place write in forward to a value
forward created itself (the frontend rejects writes to inputs):

- the value carries no gradient (a list filled by index, `mask.bernoulli_(p)` on a
  fresh tensor, a `torch.zeros` buffer filled with constants): accepted as written,
  and backward reads its final value, as Python's late binding says;
- it is a differentiable tensor: the write is rewritten out of place (`t.clamp_(0)`
  becomes `t = t.clamp(0)`, `torch.relu_(t)` becomes `t = torch.relu(t)`,
  `F.relu(t, inplace=True)` drops the flag, `t[i] = v` becomes
  `t = _setitem(t, i, v)`), as augmented assignment already is, so reverse mode and
  recomputation see a plain binding;
- where that is impossible (no out-of-place twin, an attribute store, `out=`, another
  name that may share the tensor's memory), it is rejected with S2S123, naming the op.

Invariant: the returned statements compute the same values as the source's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.cst import (
    as_expression,
    bound,
    bound_anywhere,
    bound_target,
    calls_name,
    dotted,
    findall,
    is_name,
    nodes,
    says_inplace,
    sole_target,
)
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.model import Differentiator, InPlace
from s2sgrad.lift import aliasing_names, grad_off, may_alias_at
from s2sgrad.lines import line_text
from s2sgrad.names import NameAllocator
from s2sgrad.sharing import CONTAINER_ADDS, may_share
from s2sgrad.values import (
    CONTAINER_MUTATORS,
    DIFF,
    NUMBER,
    OTHER,
    SEQ,
    SETITEM,
    SETITEM_NAME,
    TENSOR,
    Evaluator,
    ModuleFacts,
    Value,
    int_expression,
    integers,
)


def out_of_place(
    diff: Differentiator,
    values: Mapping[str, Value],
    path: str,
    lines: Sequence[str],
) -> Differentiator:
    """Rewrite forward's in-place writes to differentiable tensors out of place.

    `values` are forward's values at its end (`forward_values(diff, facts).env`).
    Returns `diff` itself when nothing is rewritten.
    """
    augmented = _augmented(diff, values)
    if not diff.writes and not augmented:
        return diff
    rewrites: dict[cst.CSTNode, InPlace] = {}
    stores: dict[int, InPlace] = {}  # id of the target `t[i]` -> the write
    problems: list[Diagnostic] = []
    aliases = aliasing_names(diff)
    sharing = _Sharing(diff)
    params = {p.name for p in diff.params}
    gradless = _gradless(diff)
    plain: set[int] = set()  # `h += y` on a tensor forward made: `h = h + y`
    for line, node in augmented:
        if id(node) in gradless:
            continue  # kept as written: see below
        why = sharing.at.get(id(node))
        if why is not None:
            problems.append(_reject_augmented(node, line, why, path, lines))
            continue
        assert isinstance(node.target, cst.Name)
        name = node.target.value
        value = values.get(name)
        if name in params and _first_binding(diff, name, node):
            why = "it is an input, and the caller's tensor would change with it"
            problems.append(_reject_augmented(node, line, why, path, lines, "S2S103"))
            continue
        aliased = may_alias_at(diff, name, node, aliases)
        if name not in params and not aliased and value and value.diff:
            plain.add(id(node))
    for write in diff.writes:
        if id(write.node) in gradless:
            # Under `torch.no_grad()` the closure changes the values and keeps the
            # graph: autograd differentiates the value as computed before (`t = x *
            # w`) at the new values. Run as written, the op does the same; written
            # out of place, `t` lost its graph (orders 2-3 wrong).
            continue
        value = values.get(write.name)
        if value is not None and _changes_an_element(write, value):
            problems.append(_reject_element(write, path, lines))
            continue
        if value is not None and _may_hand_back(diff, write, value, aliases):
            why = (
                "it may be the very tensor of another name (what it was bound to "
                "may hand its argument back), which would miss the change"
            )
            problems.append(_reject(write, why, path, lines))
            continue
        if write.kind == "helper" and value is not None and value.kinds & {SEQ, OTHER}:
            problems.append(_reject_filled(write, path, lines))
            continue
        if value is None or TENSOR not in value.kinds or not value.diff:
            continue  # carries no gradient: forward builds it, backward reads it
        shared = sharing.at.get(id(write.node))
        if write.kind == "store":
            why = _why_not_store(diff, write, aliases, shared)
            if why is None:
                stores[id(write.node)] = write
            else:
                problems.append(_reject(write, why, path, lines))
            continue
        call = _call_of(diff, write)
        why = _why_not(diff, write, call, aliases, shared)
        if why is None:
            assert call is not None
            rewrites[call] = write
        else:
            problems.append(_reject(write, why, path, lines))
    if problems:
        raise TransformError(problems)
    if not rewrites and not plain and not stores:
        return diff
    rewriter = _Rewrite(diff, rewrites, plain, stores, values)
    statements = tuple(_statement(s.visit(rewriter)) for s in diff.statements)
    lines_of = dict(diff.statement_lines)
    for new, old in rewriter.replaced.items():
        if old in lines_of:
            lines_of[new] = lines_of[old]
    qualified = {**diff.qualified_names, **rewriter.qualified}
    return replace(
        diff,
        statements=statements,
        statement_lines=lines_of,
        qualified_names=qualified,
    )


def _gradless(diff: Differentiator) -> set[int]:
    """The ids of the nodes inside forward's `with torch.no_grad():` blocks (also
    `torch.inference_mode()` and `torch.set_grad_enabled(False)`)."""
    found: set[int] = set()
    for statement in diff.statements:
        for block in findall(statement, cst.With):
            if any(grad_off(item.item, diff) for item in block.items):
                found |= {id(n) for n in nodes(block.body)}
    return found


def _statement(node: object) -> cst.BaseStatement:
    assert isinstance(node, cst.BaseStatement)
    return node


def _call_of(diff: Differentiator, write: InPlace) -> cst.Call | None:
    """The call that writes (for `inplace=True`, the call around the argument)."""
    if isinstance(write.node, cst.Call):
        return write.node
    if isinstance(write.node, cst.Arg):
        for statement in diff.statements:
            for call in findall(statement, cst.Call):
                if any(a is write.node for a in call.args):
                    return call
    return None


def _why_not_store(
    diff: Differentiator, write: InPlace, aliases: frozenset[str], shared: str | None
) -> str | None:
    """Why an item store cannot be rewritten as `t = _setitem(t, index, value)`, or
    None when it can: `t[index] = value` or `t[index] op= value`, a statement of its
    own, on a name no other name shares."""
    target = write.node
    if not (
        isinstance(target, cst.Subscript)
        and is_name(target.value, write.name)
        and _index(target) is not None
    ):
        return "an attribute store, a store through a part or view, or a starred index"
    if not any(_store_statement(small, target) for small in _smalls(diff)):
        return "it is not a statement of its own (`t[i] = u = v`, a `del`)"
    if may_alias_at(diff, write.name, target, aliases):
        return "it may be an input's own tensor, which the caller would see change"
    return shared


def _smalls(diff: Differentiator) -> list[cst.BaseSmallStatement]:
    """Forward's small statements, at every depth (not in nested functions)."""
    found: list[cst.BaseSmallStatement] = []
    for statement in diff.statements:
        for line in findall(statement, cst.SimpleStatementLine):
            found += line.body
    return found


def _store_statement(small: cst.BaseSmallStatement, target: cst.Subscript) -> bool:
    """Whether `small` is `target = value` or `target op= value`, alone."""
    if isinstance(small, cst.Assign):
        return len(small.targets) == 1 and small.targets[0].target is target
    return isinstance(small, cst.AugAssign) and small.target is target


def _index(target: cst.Subscript) -> cst.BaseExpression | None:
    """The index of `t[...]` as an expression (`t[:, 0]`: `(slice(None), 0)`), or
    None for a starred index."""
    items: list[cst.BaseExpression] = []
    for element in target.slice:
        index = element.slice
        if isinstance(index, cst.Index):
            if index.star is not None:
                return None
            items.append(index.value)
        else:
            assert isinstance(index, cst.Slice)
            # slice(a) is slice(None, a): the start is spelled whenever more follows.
            bounds = [index.lower, index.upper, index.step]
            if bounds[2] is None:
                bounds.pop()
                if bounds == [None, None]:
                    bounds = [None]
            args = [cst.Arg(b if b is not None else cst.Name("None")) for b in bounds]
            items.append(cst.Call(cst.Name("slice"), args))
    if len(items) == 1 and target.slice[-1].comma == cst.MaybeSentinel.DEFAULT:
        return items[0]
    return cst.Tuple([cst.Element(item) for item in items])


def _why_not(
    diff: Differentiator,
    write: InPlace,
    call: cst.Call | None,
    aliases: frozenset[str],
    shared: str | None,
) -> str | None:
    """Why a write cannot be rewritten out of place, or None when it can."""
    if write.kind == "helper":
        return f"the helper `{write.code}` writes to the parameter it is given"
    if write.kind == "out" or call is None:
        return "`out=` writes into it"
    if _twin(diff, write, call) is None:
        return "it has no out-of-place twin"
    if not _whole_statement(diff, call):
        return "it is used inside a larger expression"
    receiver = _receiver(write, call)
    ints = integers(
        diff.forward.body,
        frozenset(p.name for p in diff.params if p.annotation == "int"),
    )
    if _basic_part(receiver, write.name, ints) and _alone(diff, call):
        pass  # `t[0].mul_(2)`: t = _setitem(t, 0, t[0].mul(2))
    elif isinstance(receiver, cst.Subscript) and is_name(receiver.value, write.name):
        part = cst.Module([]).code_for_node(receiver)
        if _alone(diff, call):
            return (
                f"`{part}` may index by a bool, a tensor or a list, which gives a copy: the "
                f"op would change the copy and leave `{write.name}` as it was"
            )
        return f"it writes into `{part}`, a part of it, and its value is used"
    elif not is_name(receiver, write.name):
        part = cst.Module([]).code_for_node(receiver)
        return f"it writes into `{part}`, a part or view of it"
    if may_alias_at(diff, write.name, call, aliases):
        return "it may be an input's own tensor, which the caller would see change"
    return shared


def _basic_part(receiver: cst.BaseExpression, name: str, ints: frozenset[str]) -> bool:
    """Whether `receiver` is `name[...]` by basic indexing (ints, slices, `None`,
    `...`): a view of the tensor, so that an in-place op on it changes the tensor, as
    `_setitem` of its out-of-place result does. An index by a bool, a tensor or a
    list makes a copy, which the op would change instead (rejected: the source's
    write would change nothing)."""
    return (
        isinstance(receiver, cst.Subscript)
        and is_name(receiver.value, name)
        and _index(receiver) is not None
        and _int_index(receiver, ints)
    )


def _alone(diff: Differentiator, call: cst.Call) -> bool:
    """Whether `call` is a statement of its own (`t[0].mul_(2)`, not `u = ...`)."""
    return any(
        isinstance(small, cst.Expr) and small.value is call for small in _smalls(diff)
    )


def _receiver(write: InPlace, call: cst.Call) -> cst.BaseExpression:
    """The tensor a write changes as the call spells it: `t[0]` in `t[0].mul_(2)`."""
    if write.kind == "method" and isinstance(call.func, cst.Attribute):
        return call.func.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[0].value if positional else cst.Name(write.name)


class _Sharing:
    """Which names may share a tensor's memory with another name, at each in-place
    write of forward (an augmented assignment or an in-place call), in statement order.

    `h = x` then `h = h @ w` then `h += b`: at the write `h` is fresh, nothing else
    sees it. A name is shared from a binding that makes it another name's tensor or a
    view of it (`v = t.view(-1)`, `pre = h`, `r` in `for r in t.unbind(0)`), or that puts
    it into a container (`saved = [h]`, `kept.append(h)`), until a binding of a fresh
    value in straight-line code clears it. Inside a branch or a loop a binding only adds
    sharing (a loop body is read twice, for what its end hands its start).
    """

    def __init__(
        self, diff: Differentiator, tensor: Callable[[str], bool] | None = None
    ) -> None:
        self.diff = diff
        #: Whether a name surely holds a tensor, where that is known (backward):
        #: `gx[i] = acc` into a tensor copies `acc`'s values, and `gx` holds none.
        self.tensor = tensor
        #: id of a write node -> why the name it writes is shared.
        self.at: dict[int, str] = {}
        self._reasons: dict[str, str] = {}
        self._writes = {id(w.node): w.name for w in diff.writes}
        self._block(diff.statements, inside=False)

    def _block(self, statements: Sequence[cst.BaseStatement], inside: bool) -> None:
        for statement in statements:
            self._statement(statement, inside)

    def _statement(self, statement: cst.BaseStatement, inside: bool) -> None:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self._record_writes(small)
                self._bind(small, inside)
            return
        if isinstance(statement, cst.FunctionDef):
            return
        if isinstance(statement, cst.For):
            self._share(_names_bound(statement.target), statement.iter, inside=True)
        loop = isinstance(statement, (cst.For, cst.While))
        for _ in range(2 if loop else 1):
            for block in _blocks(statement):
                self._block(block, inside=True)

    def _record_writes(self, small: cst.BaseSmallStatement) -> None:
        if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
            reason = self._reasons.get(small.target.value)
            if reason is not None:
                self.at[id(small)] = reason
        for node in findall(small, (cst.Call, cst.Arg, cst.Subscript)):
            name = self._writes.get(id(node))
            if name is not None and name in self._reasons:
                self.at[id(node)] = self._reasons[name]

    def _bind(self, small: cst.BaseSmallStatement, inside: bool) -> None:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                self._pairs(target.target, small.value, inside)
                self._held(target.target, small.value)
        elif isinstance(small, cst.AugAssign) and not isinstance(
            small.value, (cst.Integer, cst.Float)
        ):
            self._held(small.target, small.value)  # `hs += [h]`
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self._pairs(small.target, small.value, inside)
        elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Name)
                and func.attr.value in CONTAINER_ADDS
            ):
                for arg in call.args:
                    for held in _names_viewed(self.diff, arg.value):
                        self._reasons[held] = (
                            f"`{func.value.value}` may hold it, and would not see the "
                            "change"
                        )

    def _held(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        """`hs[0] = h`, `box.h = h`, `hs += [h]`: the container may hold `h`."""
        base = target
        while isinstance(base, (cst.Subscript, cst.Attribute)):
            base = base.value
        stored = (
            base is not target
            or isinstance(target, cst.Name)
            and isinstance(value, (cst.List, cst.Tuple))
        )
        if not stored or not isinstance(base, cst.Name):
            return
        if (
            isinstance(target, cst.Subscript)
            and self.tensor
            and self.tensor(base.value)
        ):
            return  # a store into a tensor copies the values
        for held in _names_viewed(self.diff, value):
            if held != base.value:
                self._reasons[held] = (
                    f"`{base.value}` may hold it, and would not see the change"
                )

    def _pairs(
        self, target: cst.BaseExpression, value: cst.BaseExpression, inside: bool
    ) -> None:
        for part, part_value in _paired(target, value):
            self._share(_names_bound(part), part_value, inside)

    def _share(
        self, targets: list[str], value: cst.BaseExpression, inside: bool
    ) -> None:
        viewed = _names_viewed(self.diff, value)
        for target in targets:
            others = [v for v in viewed if v != target]
            if others:
                self._reasons[target] = (
                    f"it may be `{others[0]}`'s tensor or a view of it, which would "
                    "not see the change"
                )
                for other in others:
                    self._reasons[other] = (
                        f"`{target}` may share its memory, and would not see the change"
                    )
            elif target not in viewed and not inside:
                self._reasons.pop(target, None)  # a fresh value


def _paired(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """`a, b = u, v` element by element; anything else as a whole."""
    if (
        isinstance(target, (cst.Tuple, cst.List))
        and isinstance(value, (cst.Tuple, cst.List))
        and len(target.elements) == len(value.elements)
        and not any(
            isinstance(e, cst.StarredElement)
            for e in (*target.elements, *value.elements)
        )
    ):
        return [
            pair
            for left, right in zip(target.elements, value.elements, strict=True)
            for pair in _paired(left.value, right.value)
        ]
    return [(target, value)]


def _names_bound(target: cst.BaseExpression) -> list[str]:
    return sorted(bound_target(target))


def _blocks(node: cst.CSTNode) -> list[Sequence[cst.BaseStatement]]:
    """The statement lists inside a compound statement (bodies, `elif`, `else`,
    handlers, `finally`)."""
    found: list[Sequence[cst.BaseStatement]] = []
    for child in node.children:
        if isinstance(child, cst.IndentedBlock):
            found.append(child.body)
        elif isinstance(
            child,
            (cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler, cst.If),
        ):
            found += _blocks(child)
    return found


def _augmented(
    diff: Differentiator, values: Mapping[str, Value]
) -> list[tuple[int, cst.AugAssign]]:
    """Forward's `name op= value` statements (with their lines) on a value that may
    be a tensor: these change the tensor in place, where s2sgrad reads them as a new
    binding."""
    found = []
    for statement in diff.statements:
        for line in findall(statement, cst.SimpleStatementLine):
            for node in line.body:
                if not (
                    isinstance(node, cst.AugAssign)
                    and isinstance(node.target, cst.Name)
                ):
                    continue
                value = values.get(node.target.value)
                if value is None or TENSOR in value.kinds:
                    found.append((diff.statement_lines.get(line, 0), node))
    return found


def _names_viewed(diff: Differentiator, value: cst.BaseExpression) -> list[str]:
    """The names whose tensors `value` may be or share memory with."""
    return [
        n.value for n in findall(value, cst.Name) if _may_view(diff, value, n.value)
    ]


def _twin(
    diff: Differentiator, write: InPlace, call: cst.Call
) -> cst.BaseExpression | None:
    """The out-of-place callee for a write (`t.clamp`, `torch.relu`, `F.relu`)."""
    func = call.func
    if write.kind == "inplace":
        return func
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if write.kind == "method" and method == "copy_":
        return func if _copied(call) is not None else None  # `_Rewrite._plain`
    if write.kind == "method":
        twin = opfacts.out_of_place(method)
        return func.with_changes(attr=cst.Name(twin)) if twin else None
    qualified = diff.qualified_names.get(func) if dotted(func) else None
    if qualified is None or not method.endswith("_"):
        return None
    plain = qualified[:-1]
    if not opfacts.signatures(plain):
        return None
    return func.with_changes(attr=cst.Name(method[:-1]))


def _copied(call: cst.Call) -> cst.BaseExpression | None:
    """The value `t.copy_(v)` copies into `t`; None where the call says more
    (`non_blocking=True`)."""
    if len(call.args) != 1 or call.args[0].star or call.args[0].keyword:
        return None
    return call.args[0].value


def _whole_statement(diff: Differentiator, node: cst.CSTNode) -> bool:
    """Whether the write is a statement of its own, or the value of `u = ...`."""
    for statement in diff.statements:
        for line in findall(statement, cst.SimpleStatementLine):
            for small in line.body:
                if isinstance(small, cst.Expr) and small.value is node:
                    return True
                if (
                    isinstance(small, cst.Assign)
                    and small.value is node
                    and len(small.targets) == 1
                    and isinstance(small.targets[0].target, cst.Name)
                ):
                    return True
    return False


def _may_view(diff: Differentiator, value: cst.BaseExpression, name: str) -> bool:
    """Whether `value` may be `name`'s tensor or share its memory."""
    return may_share(value, name, diff.qualified_names.get, diff.handing_back)


class _Rewrite(cst.CSTTransformer):
    """Replace each accepted write by a binding of its out-of-place form."""

    def __init__(
        self,
        diff: Differentiator,
        writes: dict[cst.CSTNode, InPlace],
        augmented: set[int],
        stores: dict[int, InPlace],
        values: Mapping[str, Value],
    ):
        self.diff = diff
        self.values = values
        self.writes = writes
        #: Item stores `t[i] = v` to write as `t = _setitem(t, i, v)`, by target id.
        self.stores = stores
        #: Augmented assignments to write as bindings: recomputation in backward runs
        #: with autograd on, where `h += y` would change a tensor autograd saved.
        self.augmented = augmented
        #: New statement -> the one it replaces (for source line numbers): every
        #: statement, since a transformer rebuilds the ones it does not change too.
        self.replaced: dict[cst.CSTNode, cst.CSTNode] = {}
        #: Qualified names of the new callees (`torch.relu`).
        self.qualified: dict[cst.CSTNode, str] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def on_leave(
        self, original_node: cst.CSTNodeT, updated_node: cst.CSTNodeT
    ) -> cst.CSTNodeT | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNodeT]:
        left = super().on_leave(original_node, updated_node)
        if isinstance(original_node, cst.BaseStatement) and isinstance(
            left, cst.BaseStatement
        ):
            self.replaced[left] = original_node
        return left

    def leave_SimpleStatementLine(
        self,
        original_node: cst.SimpleStatementLine,
        updated_node: cst.SimpleStatementLine,
    ) -> cst.SimpleStatementLine:
        body: list[cst.BaseSmallStatement] = []
        changed = False
        for small in original_node.body:
            if isinstance(small, cst.AugAssign) and id(small) in self.augmented:
                binding = _binding(small)
                if self._may_promote([small.value]) and _surely_tensor(
                    self.diff.statements, small.target, self.values, self.diff
                ):
                    binding = binding.with_changes(
                        value=_keeping_dtype(binding.value, small.target)
                    )
                body.append(binding)
                changed = True
                continue
            store = self._store(small)
            if store is not None:
                body.append(store)
                changed = True
                continue
            call = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
            write = self.writes.get(call) if call is not None else None
            if write is None or not isinstance(call, cst.Call):
                body.append(small)
                continue
            changed = True
            target = cst.Name(write.name)
            receiver = _receiver(write, call)
            copied = _copied(call) if write.kind == "method" else None
            if _method(call) == "copy_" and copied is not None:
                # `t.copy_(v)` is `t[...] = v` (broadcast, cast), `t[0].copy_(v)`
                # is `t[0] = v`.
                whole = cst.SubscriptElement(cst.Index(cst.Ellipsis()))
                part = receiver
                if not isinstance(part, cst.Subscript):
                    part = cst.Subscript(target, [whole])
                plain: cst.BaseExpression = self._setitem(write.name, part, copied)
            elif isinstance(receiver, cst.Subscript):  # `t[0].mul_(2)`
                plain = self._setitem(write.name, receiver, self._plain(call, write))
            else:
                plain = self._plain(call, write)
                if write.kind == "method" and self._may_promote(
                    [a.value for a in call.args]
                ):
                    plain = _keeping_dtype(plain, target)
            body.append(cst.Assign([cst.AssignTarget(target)], plain))
            if isinstance(small, cst.Assign):
                body.append(small.with_changes(value=cst.Name(write.name)))
        if not changed:
            return updated_node
        return updated_node.with_changes(body=body)

    def _may_promote(self, operands: Sequence[cst.BaseExpression]) -> bool:
        """Whether an operand may be a tensor, whose dtype may promote the result's:
        in place, the result keeps the changed tensor's dtype (a bfloat16 `h += b`
        with a float32 `b` stays bfloat16, as autocast leaves it)."""
        return not all(_number(operand, self.values) for operand in operands)

    def _store(self, small: cst.BaseSmallStatement) -> cst.Assign | None:
        """`t[i] = v` as `t = _setitem(t, i, v)`; `t[i] += v` as
        `t = _setitem(t, i, t[i] + v)`, which is what Python runs for it."""
        if isinstance(small, cst.Assign):
            target = small.targets[0].target
            value = small.value
        elif isinstance(small, cst.AugAssign):
            target = small.target
            operator = type(small.operator).__name__.removesuffix("Assign")
            value = cst.BinaryOperation(
                target, getattr(cst, operator)(), _bracketed(small.value)
            )
        else:
            return None
        if id(target) not in self.stores:
            return None
        assert isinstance(target, cst.Subscript)
        name = self.stores[id(target)].name
        call = self._setitem(name, target, value)
        return cst.Assign([cst.AssignTarget(cst.Name(name))], call)

    def _setitem(
        self, name: str, target: cst.Subscript, value: cst.BaseExpression
    ) -> cst.Call:
        """`_setitem(name, index, value)` for a store into `target`, `name[index]`."""
        index = _index(target)
        assert index is not None
        func = cst.Name(SETITEM_NAME)
        self.qualified[func] = SETITEM
        return cst.Call(func, [cst.Arg(cst.Name(name)), cst.Arg(index), cst.Arg(value)])

    def _plain(self, call: cst.Call, write: InPlace) -> cst.Call:
        twin = _twin(self.diff, write, call)
        assert twin is not None
        if write.kind == "function":
            qualified = self.diff.qualified_names[call.func]
            self.qualified[twin] = qualified[:-1]
        args: Sequence[cst.Arg] = call.args
        if write.kind == "inplace":
            args = [
                a
                for a in call.args
                if a.keyword is None or a.keyword.value != "inplace"
            ]
            if args:
                args = [
                    *args[:-1],
                    args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT),
                ]
        return call.with_changes(func=twin, args=args)


def _binding(node: cst.AugAssign) -> cst.Assign:
    """`h += y` as `h = h + y` (the right-hand side bracketed where it binds looser)."""
    operator = type(node.operator).__name__.removesuffix("Assign")
    return cst.Assign(
        [cst.AssignTarget(node.target)],
        cst.BinaryOperation(
            node.target, getattr(cst, operator)(), _bracketed(node.value)
        ),
    )


def _surely_tensor(
    statements: Sequence[cst.BaseStatement],
    target: cst.BaseAssignTargetExpression,
    values: Mapping[str, Value],
    diff: Differentiator,
    kinds: frozenset[str] = frozenset({TENSOR}),
) -> bool:
    """Whether `target`, a name, holds a tensor at every `target op= ...`: every
    binding of it is `name = value` of a tensor. `total = 0` then `total += t` adds
    to a number first, which has no dtype to keep. (With `kinds`: a value of those
    kinds, a tensor among them.)"""
    if not isinstance(target, cst.Name):
        return False
    return _every_binding(
        statements,
        target.value,
        values,
        diff,
        lambda value: TENSOR in value.kinds and value.kinds <= kinds,
        lambda value: bool(value.kinds) and value.kinds <= kinds,
    )


def _surely_list(
    statements: Sequence[cst.BaseStatement],
    name: str,
    values: Mapping[str, Value],
    diff: Differentiator,
) -> bool:
    """Whether `name` holds a list, a dict (or a tuple) wherever it is bound: then
    `name[i] = v` replaces an element (or raises) and never changes a tensor the
    container holds, though one may be an incoming gradient (`grads = [grad,
    grad]`)."""

    def container(value: Value) -> bool:
        return value.kinds == {SEQ} and value.form in ("list", "dict", "tuple")

    return _every_binding(statements, name, values, diff, container, container)


def _every_binding(
    statements: Sequence[cst.BaseStatement],
    name: str,
    values: Mapping[str, Value],
    diff: Differentiator,
    at_end: Callable[[Value], bool],
    bound_to: Callable[[Value], bool],
) -> bool:
    """Whether `name`'s value in `values` passes `at_end` and every binding of it in
    `statements` is `name = value` of a value that passes `bound_to`."""
    value = values.get(name)
    if value is None or not at_end(value):
        return False
    evaluator = Evaluator(diff.qualified_names, dict(values))
    for statement in statements:
        for node in findall(
            statement, (cst.Assign, cst.AnnAssign, cst.For, cst.NamedExpr, cst.With)
        ):
            if isinstance(node, cst.Assign) and name in bound(node):
                if not is_name(sole_target(node), name):  # not `name = ...` alone
                    return False
                if not bound_to(evaluator.expr(node.value)):
                    return False
            elif name in _bound_by(node):
                return False
    return True


def _bound_by(node: cst.CSTNode) -> set[str]:
    """The names a binding other than `=` binds itself (not in its body)."""
    if isinstance(node, (cst.AnnAssign, cst.NamedExpr, cst.For)):
        return bound_target(node.target)
    if isinstance(node, cst.With):
        return {
            name
            for item in node.items
            if item.asname is not None
            for name in bound_target(item.asname.name)
        }
    return set()


def _keeping_dtype(value: cst.BaseExpression, target: cst.BaseExpression) -> cst.Call:
    """`(value).to(target.dtype)`: the out-of-place result in the dtype the in-place
    op would have kept."""
    dtype = cst.Attribute(target, cst.Name("dtype"))
    return cst.Call(cst.Attribute(_bracketed(value), cst.Name("to")), [cst.Arg(dtype)])


def _number(node: cst.BaseExpression, values: Mapping[str, Value]) -> bool:
    """Whether `node` is a Python number: a literal, or a name forward binds to
    numbers only."""
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Name):
        value = values.get(node.value)
        return value is not None and bool(value.kinds) and value.kinds <= {NUMBER}
    return False


def _bracketed(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value` in brackets where it binds looser than the operator it goes beside."""
    if isinstance(
        value,
        (cst.Name, cst.Call, cst.Attribute, cst.Subscript, cst.Integer, cst.Float),
    ):
        return value
    return value.with_changes(
        lpar=[cst.LeftParen(), *value.lpar], rpar=[*value.rpar, cst.RightParen()]
    )


def _first_binding(diff: Differentiator, name: str, node: cst.AugAssign) -> bool:
    """Whether `name op= ...` at `node` may still see the parameter `name` holds:
    no statement of forward's top level before it binds `name` again."""
    for statement in diff.statements:
        if node in set(findall(statement, cst.AugAssign)):
            return True
        if isinstance(statement, cst.SimpleStatementLine) and name in bound(statement):
            return False
    return True


def _reject_augmented(
    node: cst.AugAssign,
    line: int,
    why: str,
    path: str,
    lines: Sequence[str],
    code: str = "S2S123",
) -> Diagnostic:
    target = node.target
    assert isinstance(target, cst.Name)
    op = cst.Module([]).code_for_node(node.operator).strip()
    text = line_text(lines, line)
    found = re.search(rf"\b{re.escape(target.value)}\s*{re.escape(op)}", text)
    column = found.start() + 1 if found else 1
    return Diagnostic(
        code,
        f"`{target.value} {op} ...` changes the tensor `{target.value}` in place "
        f"(Python's augmented assignment on a tensor), and s2sgrad reads it as a new "
        f"binding: {why}",
        path,
        line,
        column,
        line_text(lines, line),
        f"write `{target.value} = {target.value} {op[:-1]} ...`, which makes a new "
        "tensor and leaves the one other names hold unchanged",
    )


def _may_hand_back(
    diff: Differentiator, write: InPlace, value: Value, aliases: frozenset[str]
) -> bool:
    """Whether `write` changes a name that values call a tensor without a gradient,
    or an object of unknown kind, but that may be another name's tensor where it runs
    (`u = t.type(dtype)`, `u = getattr(t, "contiguous")()`): that tensor may carry
    a gradient, and the change would reach it unseen."""
    if TENSOR in value.kinds and value.diff or not value.kinds & {TENSOR, OTHER}:
        return False  # a tensor with a gradient: judged below, as every such write
    return may_alias_at(diff, write.name, write.node, aliases)


def _changes_an_element(write: InPlace, value: Value) -> bool:
    """Whether `write` changes, in place, a differentiable tensor that the list,
    tuple or dict `value` holds (`keep[0].mul_(2)`, `parts[0][1] = 0`), rather than
    what the container holds (`hs[i] = h`)."""
    if SEQ not in value.kinds or TENSOR in value.kinds and value.diff:
        return False
    element = value.element()
    through = write.depth >= (2 if write.kind == "store" else 1)
    return through and element.holds_tensor and element.diff


def _reject_element(write: InPlace, path: str, lines: Sequence[str]) -> Diagnostic:
    return Diagnostic(
        "S2S123",
        f"{_shown(write)} changes in place a differentiable tensor that "
        f"`{write.name}` holds, and s2sgrad cannot write it out of place: the tensor "
        "may have another name (the one it was put in with, or an input it views), "
        "which would miss the change",
        path,
        write.line,
        write.column,
        line_text(lines, write.line),
        "compute the new value out of place and put it in a new list "
        f"(`{write.name}_new = [p * 2 for p in {write.name}]`)",
    )


def _reject(write: InPlace, why: str, path: str, lines: Sequence[str]) -> Diagnostic:
    return Diagnostic(
        "S2S123",
        f"{_shown(write)} changes `{write.name}`, a differentiable tensor forward "
        f"computed, in place, and s2sgrad cannot write it out of place: {why}",
        path,
        write.line,
        write.column,
        line_text(lines, write.line),
        _hint(write),
    )


def _reject_filled(write: InPlace, path: str, lines: Sequence[str]) -> Diagnostic:
    """A helper that changes a list or dict forward built (`_push(acc, t)`): reverse
    mode and recomputation follow forward's own statements, not what a helper puts
    into a container it is given (the recomputation dropped the call: order 1 wrong)."""
    return Diagnostic(
        "S2S129",
        f"forward hands `{write.name}` to the helper `{write.code}`, which changes it "
        "in place: reverse mode and recomputation do not follow what a helper puts "
        "into a list or dict it is given",
        path,
        write.line,
        write.column,
        line_text(lines, write.line),
        f"have `{write.code}` return the new value and bind it "
        f"(`{write.name} = {write.code}(...)`, building a new list or dict), or do "
        "the change in forward itself",
    )


def _shown(write: InPlace) -> str:
    return (
        f"`{write.code}(...)`"
        if write.kind in ("method", "function", "helper")
        else f"`out={write.code}`" if write.kind == "out" else f"`{write.code}`"
    )


def _hint(write: InPlace) -> str:
    name = write.name
    if write.kind == "helper":
        return (
            f"have `{write.code}` compute the new value out of place and return it, "
            f"and bind the result to a new name (`{name}_new = {write.code}(...)`)"
        )
    if write.kind == "store":
        return (
            f"give `{name}` a tensor of its own before the store (`{name} = "
            f"{name}.clone()`), or compute the new value out of place "
            "(`torch.where`, `index_put`, `scatter`)"
        )
    return (
        "compute the new value out of place and bind it to a name "
        f"(`{name}_new = torch.where(...)`, `index_put`, `scatter`), or store it by "
        f"index (`{name}[i] = value`), which s2sgrad writes out of place: reverse "
        "mode and recomputation need each value bound once"
    )


# -- backward ------------------------------------------------------------------------


def backward_out_of_place(
    diff: Differentiator,
    values: Mapping[str, Value],
    facts: ModuleFacts,
    path: str,
    lines: Sequence[str],
) -> Differentiator:
    """Rewrite backward's in-place writes to tensors backward made, out of place.

    Backward runs again under autograd for every order past the first, where an
    in-place op on a tensor an earlier op saved fails autograd's version check
    (`d = torch.sigmoid(x); d.mul_(1 - d)`: sigmoid saved `d`). Written as a new
    binding (`d = d.mul(1 - d)`) it computes the same values and keeps every saved
    tensor as it was. A write is rewritten only where that provably changes nothing:
    its name is backward's own (neither an incoming gradient nor captured, which the
    frontend refuses to change), it is not under `torch.no_grad()` (where the closure
    keeps the graph of the value as it was), and no other name may share its tensor
    (a view, an alias, a container holding it, the value an in-place call returns, a
    walrus). Any other write is kept as written, except one that changes an incoming
    gradient through another name (`d = g; d.mul_(2)`): S2S103, as `g.mul_(2)` is.

    `values` are forward's values at its end: what backward reads of them. The
    statements not rewritten keep their nodes, which lifting and the maps of `diff`
    know by identity. Returns `diff` itself when nothing is rewritten.
    """
    if not isinstance(diff.backward.body, cst.IndentedBlock):
        return diff
    # A chain in an operand of a chain written out of place
    # (`torch.ones_like(x).sub_(torch.tanh(x).pow_(2))`) can be named once the outer
    # one is: each round names and rewrites one level of such chains.
    named = _named_receivers(diff)
    while True:
        rewritten = _rewritten(named, values, facts, path, lines)
        if rewritten is named:
            return rewritten
        named = _named_receivers(rewritten)
        if named is rewritten:
            return rewritten


def _rewritten(
    diff: Differentiator,
    values: Mapping[str, Value],
    facts: ModuleFacts,
    path: str,
    lines: Sequence[str],
) -> Differentiator:
    """One round of `backward_out_of_place` on a backward whose chains on new
    tensors are named: `diff` itself where nothing is rewritten."""
    body = diff.backward.body
    assert isinstance(body, cst.IndentedBlock)
    # Backward's own names: what it binds (a name forward binds too is backward's
    # own there, as Python scopes it), its incoming gradients aside.
    own = bound(body) - set(diff.grad_params)
    found = [w for w in _backward_writes(body.body, diff) if w.name in own]
    if not found:
        return diff
    env: dict[str, Value] = dict(values)
    env.update({name: DIFF for name in diff.grad_params})
    evaluator = Evaluator(diff.qualified_names, env, facts)
    evaluator.run(body.body)
    # Backward's statements read as a forward, for the judges of forward's writes.
    inside = replace(
        diff,
        statements=tuple(body.body),
        writes=tuple(
            InPlace(w.name, w.node, w.kind, "", 0, 0) for w in found if w.kind != "aug"
        ),
    )
    escapes = _Escapes(body, found, diff, evaluator.env)
    sharing = _Sharing(inside, escapes.tensor)
    aliases = aliasing_names(inside)
    gradless = _gradless(inside)
    # `e = (d := g * w)`: the walrus binds `d` and hands its value on at once.
    walrus = {
        name
        for node in nodes(body)
        if isinstance(node, cst.NamedExpr)
        for name in bound_target(node.target)
    }
    incoming = _gradient_views(body.body, diff)
    problems: list[Diagnostic] = []
    qualified: dict[cst.CSTNode, str] = {}
    bindings: dict[cst.BaseSmallStatement, list[cst.BaseSmallStatement]] = {}
    dynamic = any(
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value in _DYNAMIC
        for node in nodes(body)
    )
    counters = integers(body)
    # A write in a `with` block may run with grad mode off however the block says
    # so (`with ctx:`, `set_grad_enabled(flag)`), where the closure keeps the graph;
    # one in a `try` may raise halfway, or raise where its out-of-place form would
    # not, and the handler then sees what the in-place op left.
    guarded = {
        id(inner)
        for node in nodes(body)
        if isinstance(node, (cst.With, cst.Try, cst.TryStar))
        for inner in nodes(node)
    }
    grad_mode = any(
        isinstance(node, cst.Call)
        and any(
            word in (diff.qualified_names.get(node.func) or "")
            for word in _GRAD_MODE_WORDS
        )
        for node in nodes(body)
    )
    for write in found:
        shares = id(write.node) in sharing.at or may_alias_at(
            inside, write.name, write.node, aliases
        )
        if shares and write.name in incoming and not escapes.replaces_item(write):
            problems.append(_changes_incoming(write, incoming[write.name], path, lines))
            continue
        if dynamic or grad_mode or id(write.small) in guarded:
            continue  # `locals()["d"]`, `eval("d")`: any name may be read
        if _reads_a_view(write):
            continue  # `d.mul_(d[:, :1])` reads what it has written already
        if write.kind == "part" and not _int_index(_part(write), counters):
            continue  # `gx[m].add_(v)` by a mask changes a copy: kept as written
        # `n += 1` on a number rebinds it anyway; anything else must be a tensor.
        if not escapes.tensor(write.name, numbers=write.kind == "aug"):
            continue  # a list filled by index, or nothing known: kept as written
        if (
            shares
            or id(write.node) in gradless
            or write.name in walrus
            or escapes.before(write)
        ):
            continue
        bindings[write.small] = write.bindings(evaluator.env, qualified, inside)
    if problems:
        raise TransformError(problems)
    if not bindings:
        return diff
    return _with_backward(
        diff,
        *_replacing(body.body, bindings),
        qualified_names={**diff.qualified_names, **qualified},
        backward_rewritten=True,
    )


def _named_receivers(diff: Differentiator) -> Differentiator:
    """Bind the new tensor an in-place chain of backward starts from to a name, so
    that the write is one of a name, which `backward_out_of_place` judges and may
    write out of place: `return torch.exp(x).mul_(grad)` becomes `exp =
    torch.exp(x)`, `exp.mul_(grad)`, `return exp`; `d = torch.tanh(x).pow_(2)`
    becomes `d = torch.tanh(x)`, `d.pow_(2)`. Kept as written, the chain fails
    autograd's version check at order 2 (exp saved the tensor it changes).

    Only a chain that starts from an operation (a call, an operator), not from a
    name, attribute or item, whose storage may be another's; and only where it is the
    whole value of a `return`, of an assignment to one target or of an expression
    statement, or an element of a returned or assigned tuple whose elements call
    nothing that may change anything. Its operations then run in the order they ran,
    and the new statements change nothing that was not changed: the judges keep any
    write they cannot prove safe as written.
    """
    body = diff.backward.body
    assert isinstance(body, cst.IndentedBlock)
    if any(calls_name(node, name) for node in nodes(body) for name in _DYNAMIC):
        return diff  # `locals()` would see the new name
    names = NameAllocator(
        diff.local_names | set(diff.grad_params) | set(diff.globals_used)
    )
    once = _bound_once(body)
    created: dict[str, list[cst.Name]] = {}
    changed: dict[cst.BaseSmallStatement, list[cst.BaseSmallStatement]] = {}
    for _, small in _small_statements(body.body):
        new = _receivers_named(small, names, created, diff.qualified_names, once)
        if new is not None:
            changed[small] = new
    if not changed:
        return diff
    return _with_backward(
        diff,
        *_replacing(body.body, changed, own_lines=True),
        local_names=diff.local_names | set(created),
        backward_locals={
            **diff.backward_locals,
            **{name: tuple(spelled) for name, spelled in created.items()},
        },
    )


def _with_backward(
    diff: Differentiator,
    statements: list[cst.BaseStatement],
    replaced: Mapping[cst.CSTNode, cst.CSTNode],
    **changes: object,
) -> Differentiator:
    """`diff` with backward's body `statements` (from `_replacing`: each new
    statement keeps the line of the one it replaces) and the other `changes`."""
    body = diff.backward.body
    assert isinstance(body, cst.IndentedBlock)
    statement_lines = dict(diff.statement_lines)
    for new, old in replaced.items():
        if old in statement_lines:
            statement_lines[new] = statement_lines[old]
    return replace(
        diff,
        backward=diff.backward.with_changes(body=body.with_changes(body=statements)),
        statement_lines=statement_lines,
        **changes,  # type: ignore[arg-type]
    )


def _bound_once(body: cst.CSTNode) -> frozenset[str]:
    """The names that exactly one statement of `body` binds."""
    counts: dict[str, int] = {}
    for node in nodes(body):
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [as_expression(node.name)]
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            targets = [node.name]
        for target in targets:
            for name in bound_target(target):
                counts[name] = counts.get(name, 0) + 1
    return frozenset(name for name, count in counts.items() if count == 1)


def _small_statements(
    statements: Sequence[cst.BaseStatement],
) -> list[tuple[cst.SimpleStatementLine, cst.BaseSmallStatement]]:
    """The small statements in `statements` and the blocks inside them, each with its
    line (nested functions are not looked into)."""
    found: list[tuple[cst.SimpleStatementLine, cst.BaseSmallStatement]] = []
    for statement in statements:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            found += [(statement, small) for small in statement.body]
            continue
        for block in _blocks(statement):
            found += _small_statements(block)
    return found


def _receivers_named(
    small: cst.BaseSmallStatement,
    names: NameAllocator,
    created: dict[str, list[cst.Name]],
    qualified: Mapping[cst.CSTNode, str],
    once: frozenset[str],
) -> list[cst.BaseSmallStatement] | None:
    """`small` after bindings of the new tensors its in-place chains start from and
    the chains on those names (see `_named_receivers`), or None to keep it."""
    if isinstance(small, (cst.Return, cst.AugAssign)):
        value = small.value
    elif isinstance(small, (cst.Assign, cst.Expr)):
        value = (
            small.value if sole_target(small) or isinstance(small, cst.Expr) else None
        )
    else:
        return None
    if value is None:
        return None
    # `d.mul_(torch.exp(x).add_(1))`: d's one in-place op runs after its operands.
    last = _links(value) if isinstance(value, cst.Call) else []
    chains: list[cst.BaseExpression]
    if _fresh_chain(value) is not None:
        chains = [value]  # the whole value: its parts run in the order they ran
    elif _quiet(value, qualified, last[:1] if len(last) == 1 else ()):
        chains = [*_unconditional_chains(value)]
    else:
        return None
    before: list[cst.BaseSmallStatement] = []
    swapped: dict[cst.CSTNode, cst.Name] = {}
    target = sole_target(small)
    direct = False
    for found in chains:
        links = _fresh_chain(found)
        assert links is not None
        base = links[0].func
        assert isinstance(base, cst.Attribute)
        if (
            is_name(target)
            and found is value
            # bound here only: where other bindings may reach its reads (a branch
            # binding `gx = g`), the judges would take it for that value
            and target.value in once
            and not any(
                is_name(n, target.value)
                for link in links
                for arg in link.args
                for n in nodes(arg)
            )
        ):
            # `d = torch.tanh(x).pow_(2)`: d is the new tensor
            name, direct = target.value, True
        else:
            name = names.fresh(_receiver_word(base.value))
        spellings = [cst.Name(name) for _ in range(3)]
        created.setdefault(name, []).extend(spellings)
        chain: cst.BaseExpression = spellings[1]
        for link in links:
            assert isinstance(link.func, cst.Attribute)
            chain = link.with_changes(func=link.func.with_changes(value=chain))
        before += [
            cst.Assign([cst.AssignTarget(spellings[0])], base.value),
            cst.Expr(chain),
        ]
        swapped[found] = spellings[2]
    if not before:
        return None
    if direct or isinstance(small, cst.Expr) and value in swapped:
        return before  # the chain's value was dropped, or bound already
    rest = swapped.get(value) or as_expression(value.visit(_Swapping(swapped)))
    return [*before, small.with_changes(value=rest)]


class _Swapping(cst.CSTTransformer):
    """Put the name bound to each chain in the chain's place (one pass: a pass
    rebuilds the nodes around, and the next chain would not be found by identity)."""

    def __init__(self, swapped: Mapping[cst.CSTNode, cst.Name]) -> None:
        self.swapped = swapped

    def visit_Call(self, node: cst.Call) -> bool:
        return node not in self.swapped

    def leave_Call(
        self, original_node: cst.Call, updated_node: cst.Call
    ) -> cst.BaseExpression:
        return self.swapped.get(original_node, updated_node)


def _unconditional_chains(value: cst.BaseExpression) -> list[cst.Call]:
    """The in-place chains on new tensors in `value` that run whenever it runs (not
    in a branch of `a if c else b`, of `and`/`or`, in a lambda or a comprehension),
    outermost ones only, in the order libcst visits them."""
    found: list[cst.Call] = []

    def visit(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Call) and _fresh_chain(node) is not None:
            found.append(node)
            return
        if isinstance(
            node,
            (
                cst.IfExp,
                cst.BooleanOperation,
                cst.Lambda,
                cst.ListComp,
                cst.SetComp,
                cst.DictComp,
                cst.GeneratorExp,
            ),
        ):
            return
        for child in node.children:
            visit(child)

    visit(value)
    return found


def _fresh_chain(node: cst.BaseExpression) -> list[cst.Call] | None:
    """The links of an in-place chain on a new tensor (`torch.exp(x).mul_(g)`,
    `(a * b).add_(1)`), innermost first; None for anything else."""
    links: list[cst.Call] = []
    while (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and opfacts.is_inplace(node.func.attr.value)
        and opfacts.out_of_place(node.func.attr.value) is not None
    ):
        links.append(node)
        node = node.func.value
    if not links:
        return None
    if isinstance(node, cst.Call) and not says_inplace(node):
        return links[::-1]
    if isinstance(node, cst.BinaryOperation) or (
        isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus)
    ):
        return links[::-1]  # `+t` may be `t` itself
    return None


def _quiet(
    node: cst.BaseExpression,
    qualified: Mapping[cst.CSTNode, str],
    last: Sequence[cst.Call] = (),
) -> bool:
    """Whether evaluating `node` can change nothing but the new tensors of its
    in-place chains, before the calls `last` (which run after everything else), so
    that those parts may run in any order: it calls no function by a bare name but a
    few builtins (by their qualified names: not rebound), no in-place method outside such a chain, no method
    that fills a container, and binds no name."""
    allowed = {
        id(link)
        for inner in nodes(node)
        if isinstance(inner, cst.Call)
        for link in _fresh_chain(inner) or ()
    } | {id(call) for call in last}
    for inner in nodes(node):
        if isinstance(inner, (cst.NamedExpr, cst.Yield, cst.Await)):
            return False
        if not isinstance(inner, cst.Call) or id(inner) in allowed:
            continue
        func = inner.func
        if says_inplace(inner) or not isinstance(func, (cst.Name, cst.Attribute)):
            return False
        if isinstance(func, cst.Name) and (
            func.value not in _PURE_BUILTINS
            or qualified.get(func) != f"builtins.{func.value}"
        ):
            return False
        if isinstance(func, cst.Attribute) and (
            opfacts.is_inplace(func.attr.value)
            or func.attr.value in CONTAINER_MUTATORS
            or func.attr.value.startswith("__")
        ):
            return False
    return True


#: Builtins that change nothing, which a statement around a chain may call.
_PURE_BUILTINS = frozenset(
    {"len", "int", "float", "bool", "abs", "min", "max", "sum", "range", "tuple"}
)

#: What an operator's result is called, for the name of a new tensor.
_OPERATOR_WORDS: Mapping[type[cst.CSTNode], str] = {
    cst.Multiply: "product",
    cst.MatrixMultiply: "product",
    cst.Add: "total",
    cst.Subtract: "difference",
    cst.Divide: "quotient",
    cst.Power: "power",
    cst.Minus: "negated",
}


def _receiver_word(node: cst.BaseExpression) -> str:
    """A name for the new tensor `node` makes: its function's (`torch.exp(x)`:
    exp), or its operator's (`a * b`: product)."""
    if isinstance(node, cst.Call):
        func = node.func
        word = (
            func.attr.value
            if isinstance(func, cst.Attribute)
            else func.value if isinstance(func, cst.Name) else ""
        )
        return word if word.isidentifier() and not word.startswith("_") else "value"
    if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation)):
        return _OPERATOR_WORDS.get(type(node.operator), "value")
    return "value"


@dataclass(frozen=True)
class _BackwardWrite:
    """One in-place write of backward that may be written as a binding of `name`."""

    name: str
    #: The statement that writes, and the node the sharing judge knows it by.
    small: cst.BaseSmallStatement
    node: cst.CSTNode
    #: method (a chain `d.pow_(2).neg_()`), function (`torch.sigmoid_(d)`), inplace
    #: (`F.relu(d, inplace=True)`), copy (`d.copy_(v)`), store (`d[i] = v`,
    #: `d[i] op= v`), part (`d[i].add_(v)`, `d[i].copy_(v)`) or aug (`d op= v`).
    kind: str
    #: The Name node that spells `name` in the write: the new binding's target.
    receiver: cst.Name
    #: The line of the statement that writes.
    line: int
    #: For a torch function (`torch.sigmoid_`), its out-of-place twin's name.
    function: str | None = None

    def bindings(
        self,
        values: Mapping[str, Value],
        qualified: dict[cst.CSTNode, str],
        inside: Differentiator,
    ) -> list[cst.BaseSmallStatement]:
        """The write as bindings of its out-of-place result (one per call of a chain
        whose later calls read the name: `d.mul_(2).add_(d)` adds the doubled `d`).
        Their operands are the source's own nodes (lifting replaces captured names
        by identity)."""
        small, target = self.small, self.receiver
        if self.kind == "aug":
            assert isinstance(small, cst.AugAssign)
            value: cst.BaseExpression = _binding(small).value
            if not _number(small.value, values) and _surely_tensor(
                inside.statements, target, values, inside
            ):
                value = _keeping_dtype(value, target)
            return [_assign(target, value)]
        if self.kind == "part":  # `gx[i].add_(v)`: gx = _setitem(gx, i, gx[i].add(v))
            assert isinstance(small, cst.Expr) and isinstance(self.node, cst.Call)
            part = _part(self)
            new = (
                self.node.args[0].value
                if _method(self.node) == "copy_"
                else _method_twin(self.node, part)
            )
            func = cst.Name(SETITEM_NAME)
            qualified[func] = SETITEM
            index = _index(part)
            assert index is not None
            args = [cst.Arg(target), cst.Arg(index), cst.Arg(new)]
            return [_assign(target, cst.Call(func, args))]
        if self.kind in ("store", "copy"):
            if isinstance(self.node, cst.Subscript):
                stored = (
                    small.value
                    if isinstance(small, cst.Assign)
                    else _store_value(small, self.node)
                )
                index = _index(self.node)
            else:  # `d.copy_(v)` is `d[...] = v`
                assert isinstance(self.node, cst.Call)
                stored, index = self.node.args[0].value, cst.Ellipsis()
            func = cst.Name(SETITEM_NAME)
            qualified[func] = SETITEM
            assert index is not None and stored is not None
            args = [cst.Arg(target), cst.Arg(index), cst.Arg(stored)]
            return [_assign(target, cst.Call(func, args))]
        assert isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
        if self.kind == "inplace":
            call = small.value
            kept = [
                a
                for a in call.args
                if a.keyword is None or a.keyword.value != "inplace"
            ]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return [_assign(target, call.with_changes(args=kept))]
        if self.kind == "function":
            call = _function_twin(small.value, self.function, qualified)
            return [_assign(target, self._kept(call, [call], values, skip=1))]
        links = _links(small.value)
        if any(
            findall(a, cst.Name, lambda n: n.value == self.name)
            for link in links[1:]
            for a in link.args
        ):
            # A later call reads what the earlier ones made: one binding each.
            return [
                _assign(target, self._kept(_method_twin(link, target), [link], values))
                for link in links
            ]
        plain: cst.BaseExpression = target
        for link in links:  # each in-place call keeps the dtype
            plain = self._kept(_method_twin(link, plain), [link], values)
        return [_assign(target, plain)]

    def _kept(
        self,
        plain: cst.BaseExpression,
        calls: Sequence[cst.Call],
        values: Mapping[str, Value],
        skip: int = 0,
    ) -> cst.BaseExpression:
        """`plain` in the dtype the in-place `calls` kept, where an operand of theirs
        (past the first `skip` arguments of each) may be a tensor, which may promote
        the result's."""
        operands = [a.value for call in calls for a in call.args[skip:]]
        if all(_number(operand, values) for operand in operands):
            return plain
        return _keeping_dtype(plain, self.receiver)


def _part(write: _BackwardWrite) -> cst.Subscript:
    """The part `gx[i]` that `gx[i].add_(v)` changes."""
    assert isinstance(write.node, cst.Call) and isinstance(
        write.node.func, cst.Attribute
    )
    part = write.node.func.value
    assert isinstance(part, cst.Subscript)
    return part


def _method(call: cst.Call) -> str | None:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def _assign(target: cst.Name, value: cst.BaseExpression) -> cst.Assign:
    return cst.Assign([cst.AssignTarget(target)], value)


def _store_value(
    small: cst.BaseSmallStatement, target: cst.Subscript
) -> cst.BaseExpression | None:
    """`t[i] op= v` stores `t[i] op v`, which is what Python runs for it."""
    if not isinstance(small, cst.AugAssign):
        return None
    operator = type(small.operator).__name__.removesuffix("Assign")
    return cst.BinaryOperation(
        target, getattr(cst, operator)(), _bracketed(small.value)
    )


def _backward_writes(
    statements: Sequence[cst.BaseStatement], diff: Differentiator
) -> list[_BackwardWrite]:
    """Backward's statements that write into a name in place, and can be bindings of
    it: an in-place method (or a chain of them) on the name alone as a statement, an
    in-place torch function on it, an item store into it, an augmented assignment.
    Nested functions are not looked into."""
    found: list[_BackwardWrite] = []
    for statement, small in _small_statements(statements):
        line = diff.statement_lines.get(statement, diff.backward_line)
        write = _backward_write(small, diff, line)
        if write is not None:
            found.append(write)
    return found


def _backward_write(
    small: cst.BaseSmallStatement, diff: Differentiator, line: int
) -> _BackwardWrite | None:
    if isinstance(small, cst.AugAssign):
        target = small.target
        if isinstance(target, cst.Name):
            return _BackwardWrite(target.value, small, small, "aug", target, line)
        return _stored(small, target, line)
    if isinstance(small, cst.Assign):
        if len(small.targets) != 1:
            return None
        return _stored(small, small.targets[0].target, line)
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    call = small.value
    func = call.func
    qualified = diff.qualified_names.get(func) if dotted(func) else None
    positional = [a for a in call.args if a.keyword is None and not a.star]
    receiver = positional[0].value if positional else None
    if qualified is not None:
        if not isinstance(receiver, cst.Name):
            return None
        if says_inplace(call) and len(positional) == len(call.args) - 1:
            return _BackwardWrite(
                receiver.value, small, call, "inplace", receiver, line
            )
        if (
            isinstance(func, cst.Attribute)
            and qualified.endswith("_")
            and not qualified.endswith("__")
            and opfacts.signatures(qualified[:-1])
        ):
            twin = qualified[:-1]
            return _BackwardWrite(
                receiver.value, small, call, "function", receiver, line, twin
            )
        return None
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "copy_"
        and isinstance(func.value, cst.Name)
        and _copied(call) is not None
    ):
        return _BackwardWrite(func.value.value, small, call, "copy", func.value, line)
    if (
        isinstance(func, cst.Attribute)
        and isinstance(func.value, cst.Subscript)
        and isinstance(func.value.value, cst.Name)
        and _index(func.value) is not None
        and (
            func.attr.value == "copy_"
            and _copied(call) is not None
            or opfacts.is_inplace(func.attr.value)
            and opfacts.out_of_place(func.attr.value) is not None
        )
    ):
        name = func.value.value
        return _BackwardWrite(name.value, small, call, "part", name, line)
    links = _links(call)
    if not links:
        return None
    base = links[0].func
    assert isinstance(base, cst.Attribute)
    if not isinstance(base.value, cst.Name):
        return None
    return _BackwardWrite(base.value.value, small, links[0], "method", base.value, line)


def _stored(
    small: cst.BaseSmallStatement, target: cst.BaseExpression, line: int
) -> _BackwardWrite | None:
    """`t[i] = v` or `t[i] op= v` into a name, by an index `_setitem` can take."""
    if (
        isinstance(target, cst.Subscript)
        and isinstance(target.value, cst.Name)
        and _index(target) is not None
    ):
        name = target.value
        return _BackwardWrite(name.value, small, target, "store", name, line)
    return None


def _links(call: cst.Call) -> list[cst.Call]:
    """The calls of an in-place chain `d.pow_(2).neg_()`, innermost first, where each
    is an in-place tensor method with an out-of-place twin; empty otherwise."""
    links: list[cst.Call] = []
    node: cst.BaseExpression = call
    while isinstance(node, cst.Call):
        func = node.func
        if not (
            isinstance(func, cst.Attribute)
            and opfacts.is_inplace(func.attr.value)
            and opfacts.out_of_place(func.attr.value) is not None
        ):
            return []
        links.append(node)
        node = func.value
    return links[::-1] if isinstance(node, cst.Name) else []


def _method_twin(link: cst.Call, receiver: cst.BaseExpression) -> cst.Call:
    """`receiver.mul(...)` for the link `d.mul_(...)`."""
    func = link.func
    assert isinstance(func, cst.Attribute)
    method = opfacts.out_of_place(func.attr.value)
    assert method is not None
    return link.with_changes(
        func=func.with_changes(value=receiver, attr=cst.Name(method))
    )


def _function_twin(
    call: cst.Call, function: str | None, qualified: dict[cst.CSTNode, str]
) -> cst.Call:
    """`torch.sigmoid(s)` for `torch.sigmoid_(s)`."""
    func = call.func
    assert isinstance(func, cst.Attribute) and function is not None
    twin = func.with_changes(attr=cst.Name(func.attr.value[:-1]))
    qualified[twin] = function
    return call.with_changes(func=twin)


class _Escapes:
    """Where backward hands a name's tensor to something that may keep it.

    The sharing judge knows the bindings that make another name a tensor's (`e = d`,
    views, containers). This is the check that leaves nothing out: every read of a
    name that backward writes is either used up where it is read (an operand of
    arithmetic or a comparison, an index, the argument of a torch op that makes a new
    tensor, a value stored into a tensor) or escapes: it is returned, bound, put in a
    container, handed to a callable s2sgrad does not know (`get()` of a def with the
    default `v=d`, `map`, `d.numpy()`), or read by a lambda. An escape that may run
    before a write keeps the write as written: the tensor it handed on would not see
    the change otherwise.
    """

    def __init__(
        self,
        body: cst.IndentedBlock,
        found: Sequence[_BackwardWrite],
        diff: Differentiator,
        values: Mapping[str, Value],
    ) -> None:
        self.diff = diff
        self.values = values
        self.evaluator = Evaluator(diff.qualified_names, dict(values))
        self.statements = body.body
        #: The names backward binds (a builtin it rebinds is not the builtin).
        self.bound = bound_anywhere(body)
        self.counters = integers(body)
        self._tensors: dict[tuple[str, bool], bool] = {}
        self.parents: dict[int, cst.CSTNode] = {}
        #: Where each statement sits: (id of its block, its index there, itself).
        self.places: dict[int, tuple[int, int, cst.CSTNode]] = {}
        self._index(body)
        written = {id(w.receiver) for w in found}
        names = {w.name for w in found}
        #: For each written name, the escaping reads: the path of statements to each,
        #: or None where it escapes inside a nested function (run at any time).
        self.reads: dict[str, list[list[tuple[int, int, cst.CSTNode]] | None]] = {}
        for node in nodes(body):
            if (
                isinstance(node, cst.Name)
                and node.value in names
                and id(node) not in written
                and self._read(node)
                and self._escapes(node)
            ):
                self.reads.setdefault(node.value, []).append(self._path(node))

    def _index(self, node: cst.CSTNode) -> None:
        for i, child in enumerate(node.children):
            self.parents[id(child)] = node
            if isinstance(node, cst.IndentedBlock) and child in node.body:
                self.places[id(child)] = (id(node), i, child)
            self._index(child)

    def before(self, write: _BackwardWrite) -> bool:
        """Whether an escaping read of the written name may run before the write."""
        target = self._path(write.small)
        assert target is not None
        for path in self.reads.get(write.name, []):
            if path is None:
                return True
            shared = 0
            while (
                shared < min(len(path), len(target))
                and path[shared][:2] == target[shared][:2]
            ):
                shared += 1
            loop = any(
                isinstance(statement, (cst.For, cst.While))
                for _, _, statement in target[:shared]
            )
            if shared == len(path) or shared == len(target):
                return True  # in the same statement, or around it
            (block, index, _), (other, at, _) = path[shared], target[shared]
            if block == other:
                if index < at or loop:
                    return True
            elif loop or not isinstance(target[shared - 1][2], cst.If):
                return True  # not two branches of one `if`
        return False

    def _path(self, node: cst.CSTNode) -> list[tuple[int, int, cst.CSTNode]] | None:
        """The statements around `node`, outermost first; None inside a nested def
        or lambda."""
        path = []
        current: cst.CSTNode | None = node
        while current is not None:
            if isinstance(current, (cst.FunctionDef, cst.Lambda)):
                return None
            place = self.places.get(id(current))
            if place is not None:
                path.append(place)
            current = self.parents.get(id(current))
        return path[::-1]

    def _read(self, node: cst.Name) -> bool:
        """Whether a Name is read: not a name something binds (a target, a
        parameter, `as d`), an attribute's or a keyword's name, or `del d`."""
        parent = self.parents.get(id(node))
        if isinstance(
            parent, (cst.AssignTarget, cst.AugAssign, cst.NamedExpr, cst.For)
        ):
            return parent.target is not node
        if isinstance(parent, cst.Attribute):
            return parent.attr is not node
        if isinstance(parent, (cst.AsName, cst.Param, cst.FunctionDef, cst.ClassDef)):
            return parent.name is not node
        if isinstance(parent, cst.Arg):
            return parent.keyword is not node
        return not isinstance(parent, cst.Del)

    def _escapes(self, node: cst.CSTNode) -> bool:
        while True:
            parent = self.parents.get(id(node))
            if isinstance(parent, cst.UnaryOperation) and isinstance(
                parent.operator, cst.Plus
            ):
                node = parent  # `+a` is `a` itself
            elif isinstance(parent, cst.BinaryOperation):
                other = parent.right if parent.left is node else parent.left
                # A tensor or a number beside it makes a new tensor; an object's
                # own `__add__` may keep it.
                return not self._plain(other)
            elif isinstance(
                parent,
                (
                    cst.UnaryOperation,
                    cst.Comparison,
                    cst.ComparisonTarget,
                    cst.Expr,
                    cst.If,
                    cst.While,
                    cst.Assert,
                ),
            ):
                return False  # used up: a new value, or a test
            elif isinstance(parent, cst.Index):
                return not self._indexes_a_tensor(parent)  # a dict keeps its keys
            elif isinstance(parent, cst.BooleanOperation) or (
                isinstance(parent, cst.IfExp) and parent.test is not node
            ):
                node = parent  # `None or a` is `a`
            elif isinstance(parent, cst.IfExp):
                return False
            elif isinstance(parent, cst.Subscript) and parent.value is node:
                node = parent  # a view, or a copy
            elif isinstance(parent, cst.Attribute) and parent.value is node:
                call = self.parents.get(id(parent))
                if parent.attr.value in _METADATA:
                    return False
                if not (isinstance(call, cst.Call) and call.func is parent):
                    return True  # `a.T`, `a.data`
                method = f"torch.Tensor.{parent.attr.value}"
                if _makes_new(method, call):
                    return False
                if not _may_hand_on(method, parent.attr.value):
                    return True  # `a.numpy()`, `a.type(...)`: nothing known
                node = call
            elif isinstance(parent, cst.Arg):
                call = self.parents.get(id(parent))
                if parent.keyword is not None and parent.keyword.value == "out":
                    return True  # `torch.add(a, 0, out=a)` returns `a`
                if not isinstance(call, cst.Call) or not self._takes_values(call):
                    return True
                return False
            elif (
                isinstance(parent, (cst.Assign, cst.AugAssign)) and parent.value is node
            ):
                targets = (
                    [t.target for t in parent.targets]
                    if isinstance(parent, cst.Assign)
                    else [parent.target]
                )
                if all(self._into_tensor(t) for t in targets):
                    return False  # a store into a tensor copies the values
                return not (
                    isinstance(parent, cst.AugAssign)
                    and isinstance(parent.target, cst.Name)
                    and self.tensor(parent.target.value)
                )  # `gx += a` adds the values
            else:
                return True

    def tensor(self, name: str, numbers: bool = False) -> bool:
        """Whether every binding of `name` in backward is a tensor (or a number);
        each name is judged once."""
        key = (name, numbers)
        if key not in self._tensors:
            kinds = frozenset({TENSOR, NUMBER} if numbers else {TENSOR})
            self._tensors[key] = _surely_tensor(
                self.statements, cst.Name(name), self.values, self.diff, kinds
            )
        return self._tensors[key]

    def replaces_item(self, write: _BackwardWrite) -> bool:
        """Whether `write` is `name[i] = v` into a list or a dict, which changes no
        tensor (`name[i] += v` adds to the element in place)."""
        return (
            write.kind == "store"
            and isinstance(write.small, cst.Assign)
            and _surely_list(self.statements, write.name, self.values, self.diff)
        )

    def _into_tensor(self, target: cst.BaseExpression) -> bool:
        """Whether `target` is `t[...]` of a name that holds a tensor only."""
        return (
            isinstance(target, cst.Subscript)
            and isinstance(target.value, cst.Name)
            and self.tensor(target.value.value)
        )

    def _indexes_a_tensor(self, index: cst.Index) -> bool:
        """Whether the subscript an index belongs to indexes a tensor (which copies
        what an index tensor says), not a dict or a list (which keep it)."""
        element = self.parents.get(id(index))
        subscript = self.parents.get(id(element))
        return (
            isinstance(subscript, cst.Subscript)
            and isinstance(subscript.value, cst.Name)
            and self.tensor(subscript.value.value)
        )

    def _takes_values(self, call: cst.Call) -> bool:
        """Whether `call` reads its tensor arguments' values and keeps none of them:
        a torch op that makes a new tensor (pointwise math, a reduction), an op of
        another tensor (`x.add(a)`, `gx.copy_(a)`), a builtin such as `len`."""
        func = call.func
        qualified = self.diff.qualified_names.get(func) if dotted(func) else None
        if qualified is not None:
            return _makes_new(qualified, call)
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            receiver = _base(func.value)  # `gx[i].copy_(a)`: a method of `gx`'s
            return (
                isinstance(receiver, cst.Name) and self._plain(receiver, numbers=False)
            ) and (
                method == "copy_"
                or _makes_new(f"torch.Tensor.{method.removesuffix('_')}", call)
            )
        return (
            isinstance(func, cst.Name)
            and func.value in _CONSUMERS
            and func.value not in self.bound
            and func.value not in self.diff.globals_used
        )

    def _plain(self, node: cst.BaseExpression, numbers: bool = True) -> bool:
        """Whether `node` surely is a tensor (or a number): what arithmetic with it,
        or its tensor methods, make is new."""
        kinds = self.evaluator.expr(node).kinds
        allowed = {TENSOR, NUMBER} if numbers else {TENSOR}
        if not kinds or not kinds <= allowed:
            return False
        names = [n for n in nodes(node) if isinstance(n, cst.Name)]
        return all(
            n.value not in self.bound
            or n.value in self.counters
            or self.tensor(n.value, numbers)
            for n in names
            if n.value not in ("True", "False", "None")
        )


def _makes_new(qualified: str, call: cst.Call) -> bool:
    """Whether a torch op surely returns a new tensor, sharing no argument's memory:
    pointwise math and the reductions and products below. The tables of ops that
    may share memory come from schemas and probes, and a composite op they miss
    would share silently, so what is not known to make a new tensor is taken to
    keep one."""
    name = qualified.rsplit(".", 1)[-1]
    if name.endswith("_") or opfacts.may_share_memory(qualified):
        return False
    if qualified.startswith("torch.nn.functional.") and any(
        (a.keyword is None and i > 0)
        or (
            a.keyword is not None
            and a.keyword.value == "inplace"
            and not is_name(a.value, "False")
        )
        for i, a in enumerate(call.args)
    ):
        return False  # `F.relu(a, True)`, `inplace=flag`: maybe in place
    return (opfacts.is_pointwise(qualified) and name != "positive") or name in _NEW


#: Ops besides pointwise math that always return new tensors.
_NEW = frozenset(
    {
        "sum",
        "mean",
        "prod",
        "amax",
        "amin",
        "norm",
        "var",
        "std",
        "logsumexp",
        "softmax",
        "log_softmax",
        "matmul",
        "mm",
        "bmm",
        "mv",
        "dot",
        "outer",
        "cumsum",
        "cumprod",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_like",
        "rand_like",
        "randn_like",
        "item",
        "tolist",
    }
)


def _may_hand_on(qualified: str, name: str) -> bool:
    """Whether an op may return its input or a view of it (an in-place op does)."""
    return opfacts.may_share_memory(qualified) or (
        name.endswith("_") and not name.endswith("__")
    )


#: What the qualified names of calls that switch grad mode hold.
_GRAD_MODE_WORDS = ("grad_enabled", "grad_mode", "no_grad", "inference_mode")


def _reads_a_view(write: _BackwardWrite) -> bool:
    """Whether the write's operands hold the written tensor or a view of it (`d[:,
    :1]`, `d.t()`): in place, the op reads what it has already overwritten, where
    its out-of-place form reads the old values."""
    small = write.small
    if isinstance(write.node, cst.Call):
        operands = [
            a.value
            for call in _calls(write.node)
            for a in call.args
            if a.value is not write.receiver  # `torch.sigmoid_(d)` changes `d`
        ]
    elif isinstance(small, (cst.Assign, cst.AugAssign)):
        operands = [small.value]
    else:
        return False
    return any(_view_of(operand, write.name) for operand in operands)


def _calls(call: cst.Call) -> list[cst.Call]:
    """`call` and the calls of its receiver chain (`d.mul_(2).add_(v)`)."""
    found = [call]
    func = call.func
    while isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
        found.append(func.value)
        func = func.value.func
    return found


def _view_of(node: cst.BaseExpression, name: str) -> bool:
    """Whether `node` may be `name`'s tensor or a view of it."""
    if isinstance(node, cst.Name):
        return node.value == name
    if isinstance(node, cst.Attribute):
        return node.attr.value not in _METADATA and _view_of(node.value, name)
    if isinstance(node, cst.Subscript):
        return _view_of(node.value, name)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method = f"torch.Tensor.{node.func.attr.value}"
        return not _makes_new(method, node) and _view_of(node.func.value, name)
    return False


#: Builtins that read variables by their names at run time.
_DYNAMIC = frozenset({"locals", "vars", "globals", "eval", "exec"})


def _int_index(part: cst.Subscript, ints: frozenset[str]) -> bool:
    """Whether `d[...]` indexes by ints (`_int_expression` of the names `ints`
    holds, which `values.integers` finds), slices of ints, `None` or `...` only, so that it
    is a view of `d` (a bool, a tensor or a list would make a copy)."""
    for element in part.slice:
        index = element.slice
        if isinstance(index, cst.Slice):
            bounds = (index.lower, index.upper, index.step)
            if not all(b is None or int_expression(b, ints) for b in bounds):
                return False
        elif not (
            isinstance(index, cst.Index)
            and index.star is None
            and (
                int_expression(index.value, ints)
                or isinstance(index.value, cst.Ellipsis)
                or is_name(index.value, "None")
            )
        ):
            return False
    return True


#: Builtins that read a tensor's values and keep nothing of it.
_CONSUMERS = frozenset(
    {
        "len",
        "float",
        "int",
        "bool",
        "abs",
        "round",
        "print",
        "isinstance",
        "str",
        "repr",
    }
)
#: Attributes that are a tensor's metadata, not a view of its memory.
_METADATA = frozenset(
    {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout"}
)


def _base(node: cst.CSTNode | None) -> cst.CSTNode | None:
    """The name an expression changes through: `d` of `d[0]`, `d.T`, `d.mul_(2)`."""
    while isinstance(node, (cst.Subscript, cst.Attribute, cst.Call)):
        node = node.func if isinstance(node, cst.Call) else node.value
    return node


def _gradient_views(
    statements: Sequence[cst.BaseStatement], diff: Differentiator
) -> dict[str, str]:
    """Backward's names that may hold an incoming gradient's tensor or a view of it
    (`d = g`, `d = g.view(-1)`, `d, e = g, x`, `a, b = g.split(2)`, `for row in g`,
    `d = None or g`), each with the gradient."""
    bindings: list[tuple[str, cst.BaseExpression]] = []

    def bind(target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        for part, part_value in _paired(target, value):
            bindings.extend((name, part_value) for name in bound_target(part))

    for statement in statements:
        for node in findall(
            statement, (cst.Assign, cst.AnnAssign, cst.For, cst.NamedExpr)
        ):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    bind(target.target, node.value)
            elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)):
                if node.value is not None:
                    bind(node.target, node.value)
            elif isinstance(node, cst.For):
                bind(node.target, node.iter)
    found = {g: g for g in diff.grad_params}
    changed = True
    while changed:
        changed = False
        for name, value in bindings:
            if name in found:
                continue
            for other, gradient in list(found.items()):
                if may_share(value, other, diff.qualified_names.get, diff.handing_back):
                    found[name] = gradient
                    changed = True
                    break
    return {n: g for n, g in found.items() if n not in diff.grad_params}


def _changes_incoming(
    write: _BackwardWrite, gradient: str, path: str, lines: Sequence[str]
) -> Diagnostic:
    text = line_text(lines, write.line)
    column = len(text) - len(text.lstrip()) + 1
    return Diagnostic(
        "S2S103",
        f"this changes `{write.name}` in place, which may be the incoming gradient "
        f"`{gradient}` or a view of it",
        path,
        write.line,
        column,
        text,
        f"make `{write.name}` a new tensor first (`{write.name} = {gradient}.clone()`), "
        "or write the op out of place",
    )


def _replacing(
    statements: Sequence[cst.BaseStatement],
    changed: Mapping[cst.BaseSmallStatement, Sequence[cst.BaseSmallStatement]],
    own_lines: bool = False,
) -> tuple[list[cst.BaseStatement], dict[cst.CSTNode, cst.CSTNode]]:
    """`statements` with the small statements in `changed` replaced, and each new
    statement with the one it replaces. Only the statements on the way to a change
    are new: every other node stays the very node it was. With `own_lines`, a
    statement line that changes becomes one line per small statement (the comment
    that ended it ends the last), so that each is a statement of its own."""
    replaced: dict[cst.CSTNode, cst.CSTNode] = {}

    def rebuild(node: cst.CSTNode) -> list[cst.CSTNode]:
        if isinstance(node, cst.SimpleStatementLine):
            if not any(small in changed for small in node.body):
                return [node]
            body = [n for small in node.body for n in changed.get(small, [small])]
            if own_lines:
                lines: list[cst.CSTNode] = [
                    cst.SimpleStatementLine(
                        [small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                        leading_lines=node.leading_lines if at == 0 else (),
                        trailing_whitespace=(
                            node.trailing_whitespace
                            if at == len(body) - 1
                            else cst.TrailingWhitespace()
                        ),
                    )
                    for at, small in enumerate(body)
                ]
            else:
                lines = [node.with_changes(body=body)]
            for line in lines:
                replaced[line] = node
            return lines
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.BaseExpression)):
            return [node]
        changes: dict[str, object] = {}
        for field in fields(node):
            old = getattr(node, field.name)
            if isinstance(old, cst.CSTNode):
                (rebuilt,) = rebuild(old)
                if rebuilt is not old:
                    changes[field.name] = rebuilt
            elif isinstance(old, (list, tuple)) and any(
                isinstance(item, cst.CSTNode) for item in old
            ):
                items = [
                    new
                    for i in old
                    for new in (rebuild(i) if isinstance(i, cst.CSTNode) else [i])
                ]
                if len(items) != len(old) or any(
                    a is not b for a, b in zip(items, old, strict=True)
                ):
                    changes[field.name] = items
        if not changes:
            return [node]
        new = node.with_changes(**changes)
        replaced[new] = node
        return [new]

    rebuilt = [new for statement in statements for new in rebuild(statement)]
    return [_statement(s) for s in rebuilt], replaced
