"""Small typed helpers over libcst shared by every stage, and reading trees fast.

libcst's `visit` returns a union with its removal and flatten sentinels; the passes here
never remove the node they are called on, so these helpers narrow the type (and check it).

Trees are read here, not with `node.visit` or `libcst.matchers.findall`: for a
read-only `CSTVisitor` libcst still rebuilds and validates every node it passes (its
`visit` is the transformer's traversal), which made most of the cost of conversion.
`walk` runs a visitor's callbacks in exactly libcst's order without rebuilding
anything; `nodes` and `findall` list a tree in that order, and within `remembering()`
each subtree is listed once. The order is libcst's own: each node class's fields are
recorded from one `visit` of a node of that class.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeGuard, TypeVar

import libcst as cst

#: A kind of node that `findall` and `sole` look for.
N = TypeVar("N", bound=cst.CSTNode)


def statements(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    """Return the statements of a block, a one-line suite becoming one statement line."""
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    assert isinstance(suite, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(list(suite.body))]


def as_statement(node: object) -> cst.BaseStatement:
    assert isinstance(node, cst.BaseStatement), node
    return node


class LineDropper(cst.CSTTransformer):
    """A transformer that may leave a line with nothing to do (`emptied_line`): the
    line goes from its block, or says `pass` where the block would be empty, and
    goes from the statements `run` rewrites."""

    def __init__(self) -> None:
        super().__init__()
        self.emptied: set[int] = set()

    def run(self, block: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        found = [as_statement(s.visit(self)) for s in block]
        return [s for s in found if id(s) not in self.emptied] or found[:1]

    def emptied_line(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        emptied = line.with_changes(
            body=[cst.Pass()], trailing_whitespace=cst.TrailingWhitespace()
        )
        self.emptied.add(id(emptied))
        return emptied

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        body = [s for s in updated_node.body if id(s) not in self.emptied]
        return updated_node.with_changes(body=body or updated_node.body[:1])


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
    """The names bound in a subtree; with `nested`, in the scopes nested in it too
    (their parameters, comprehension targets and `del`s included)."""

    def __init__(self, nested: bool = False) -> None:
        self.names: set[str] = set()
        self.nested = nested

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

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)  # reached only inside a nested scope

    def visit_Del(self, node: cst.Del) -> None:
        if self.nested:
            self.names |= bound_target(node.target)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return self.nested

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return self.nested

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return self.nested

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        if self.nested:
            self.names |= bound_target(node.target)
        return self.nested


def bound(node: cst.CSTNode) -> set[str]:
    """Return the names a statement binds (not inside nested functions)."""
    visitor = _Binds()
    walk(node, visitor)
    return visitor.names


def bound_anywhere(*roots: cst.CSTNode) -> set[str]:
    """Return the names bound anywhere in the nodes, nested scopes included."""
    visitor = _Binds(nested=True)
    for root in roots:
        walk(root, visitor)
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


def _leaf_classes(base: type) -> frozenset[type]:
    """The classes of the nodes that are `base`s: `type(n) in` them is `isinstance(n,
    base)` without ABCMeta's check, which hot loops over every node pay for."""
    found: set[type] = set()
    todo = [base]
    while todo:
        kind = todo.pop()
        todo += kind.__subclasses__()
        if not inspect.isabstract(kind) and not kind.__name__.startswith("Base"):
            found.add(kind)
    return frozenset(found)


STATEMENT_CLASSES = _leaf_classes(cst.BaseStatement)


class DepthTransformer(cst.CSTTransformer):
    """A transformer that knows how many function definitions it is inside
    (`depth`: 1 in a top-level function's body, 2 in a function nested in it)."""

    def __init__(self) -> None:
        self.depth = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.depth += 1

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self.depth -= 1
        return updated_node


def spelled(*roots: cst.CSTNode) -> set[str]:
    """Every `Name` in the nodes, attribute names and keywords included: what
    `findall(node, cst.Name)` finds, at a fraction of its cost."""
    # `type(n) is cst.Name`: a leaf class, and `isinstance` goes through ABCMeta.
    return {n.value for root in roots for n in nodes(root) if type(n) is cst.Name}


def name_counts(*roots: cst.CSTNode) -> dict[str, int]:
    """How many times each `Name` occurs in the nodes (as `spelled` finds them)."""
    counts: dict[str, int] = {}
    for root in roots:
        for node in nodes(root):
            if type(node) is cst.Name:
                counts[node.value] = counts.get(node.value, 0) + 1
    return counts


class _Layout(cst.CSTVisitor):
    """Record the fields libcst visits on one node, in its order: the order in which
    `node.visit` calls `on_visit_attribute` (without entering the children)."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.root = root
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node is self.root

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.root:
            self.fields.append(attribute)


@dataclass
class _Fields:
    """The fields libcst visits on the nodes of one class, in its order. `optional`
    are those it visits only when they are present (f-string format specs): it then
    calls no attribute callback for them, and they are in `order` once seen."""

    order: tuple[str, ...]
    optional: frozenset[str]


_LAYOUTS: dict[type[cst.CSTNode], _Fields] = {}


def _fields(node: cst.CSTNode) -> _Fields:
    """The fields of `node` that hold its children, in libcst's visiting order."""
    layout = _LAYOUTS.get(type(node))
    if layout is not None and (not layout.optional or _complete(node, layout)):
        return layout
    recorder = _Layout(node)
    node.visit(recorder)
    order = tuple(recorder.fields)
    skipped = {
        name
        for name in node.__dataclass_fields__
        if name not in order and getattr(node, name) is None
    }
    if layout is not None:
        order = max(order, layout.order, key=len)
        skipped |= layout.optional
    _LAYOUTS[type(node)] = layout = _Fields(order, frozenset(skipped))
    return layout


def _complete(node: cst.CSTNode, layout: _Fields) -> bool:
    """Whether `layout` has every field of `node` that holds a child."""
    return all(
        name in layout.order or getattr(node, name) is None for name in layout.optional
    )


def nodes(root: cst.CSTNode) -> Sequence[cst.CSTNode]:
    """`root` and every node under it, in the order libcst visits them.

    Within `remembering()` (one conversion) each subtree is walked once: nodes never
    change, and the checks of every stage ask about the same statements again.
    """
    cache = _REMEMBERED.get()
    if cache is not None:
        hit = cache.get(id(root))
        if hit is not None and hit[0] is root:
            return hit[1]
    found: list[cst.CSTNode] = []
    _gather(root, found)
    if cache is not None:
        cache[id(root)] = (root, found)
    return found


_REMEMBERED: ContextVar[dict[int, tuple[cst.CSTNode, list[cst.CSTNode]]] | None]
_REMEMBERED = ContextVar("s2sgrad subtrees", default=None)


@contextmanager
def remembering() -> Iterator[None]:
    """Remember the nodes of each subtree `nodes` walks until the block ends (it
    holds the nodes by id, and the nodes themselves so that the ids stay theirs)."""
    token = _REMEMBERED.set({})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


#: Per class of field value: whether it is a libcst node. `isinstance(value,
#: cst.CSTNode)` goes through ABCMeta, and the walks below ask it of every field of
#: every node (most of a module's reading); a dict lookup by class is a fraction.
_IS_NODE: dict[type, bool] = {}


def _is_node(value: object) -> bool:
    """`isinstance(value, cst.CSTNode)`, learnt for `value`'s class."""
    known = _IS_NODE[type(value)] = isinstance(value, cst.CSTNode)
    return known


def _gather(node: cst.CSTNode, found: list[cst.CSTNode]) -> None:
    found.append(node)
    for name in _fields(node).order:
        value = getattr(node, name)
        known = _IS_NODE.get(type(value))
        if known is None:
            known = _is_node(value)
        if known:
            _gather(value, found)
        elif isinstance(value, (tuple, list)):
            for child in value:
                _gather(child, found)


def walk(root: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """Run a read-only visitor over `root` as `root.visit(visitor)` would: the same
    callbacks in the same order (attribute callbacks too, where the visitor has
    them), without rebuilding a node."""
    kind = type(visitor)
    if _attribute_hooks(kind):
        _walk_attributes(root, visitor)
    elif kind.on_visit is _ON_VISIT and kind.on_leave is _ON_LEAVE:
        _walk_methods(root, visitor, _methods(kind))
    else:
        _walk(root, visitor)


_ON_VISIT = cst.CSTVisitor.on_visit
_ON_LEAVE = cst.CSTVisitor.on_leave
_Method = Callable[[cst.CSTVisitor, cst.CSTNode], object] | None
_METHODS: dict[type[cst.CSTVisitor], dict[type[cst.CSTNode], tuple[_Method, _Method]]]
_METHODS = {}


def _methods(
    kind: type[cst.CSTVisitor],
) -> dict[type[cst.CSTNode], tuple[_Method, _Method]]:
    """The `visit_<Node>`/`leave_<Node>` methods of a visitor class, by node class,
    filled as node classes are met; None where only libcst's no-op base has one."""
    return _METHODS.setdefault(kind, {})


def _lookup(
    kind: type[cst.CSTVisitor], node: type[cst.CSTNode]
) -> tuple[_Method, _Method]:
    found: list[_Method] = []
    for prefix in ("visit_", "leave_"):
        name = prefix + node.__name__
        method = getattr(kind, name, None)
        found.append(None if method is getattr(cst.CSTVisitor, name, None) else method)
    return found[0], found[1]


def _walk_methods(
    node: cst.CSTNode,
    visitor: cst.CSTVisitor,
    methods: dict[type[cst.CSTNode], tuple[_Method, _Method]],
) -> None:
    """`_walk` for a visitor that keeps libcst's `on_visit`/`on_leave`: its methods
    are looked up once per node class rather than once per node."""
    entry = methods.get(type(node))
    if entry is None:
        entry = methods[type(node)] = _lookup(type(visitor), type(node))
    visit, leave = entry
    if visit is None or visit(visitor, node) is not False:
        for name in _fields(node).order:
            value = getattr(node, name)
            known = _IS_NODE.get(type(value))
            if known is None:
                known = _is_node(value)
            if known:
                _walk_methods(value, visitor, methods)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    _walk_methods(child, visitor, methods)
    if leave is not None:
        leave(visitor, node)


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        for name in _fields(node).order:
            value = getattr(node, name)
            known = _IS_NODE.get(type(value))
            if known is None:
                known = _is_node(value)
            if known:
                _walk(value, visitor)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    _walk(child, visitor)
    visitor.on_leave(node)


def _walk_attributes(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        layout = _fields(node)
        for name in layout.order:
            value = getattr(node, name)
            if value is None and name in layout.optional:
                continue
            visitor.on_visit_attribute(node, name)
            known = _IS_NODE.get(type(value))
            if known is None:
                known = _is_node(value)
            if known:
                _walk_attributes(value, visitor)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    _walk_attributes(child, visitor)
            visitor.on_leave_attribute(node, name)
    visitor.on_leave(node)


_HOOKS: dict[type[cst.CSTVisitor], bool] = {}
#: The name of a visitor method for an attribute (`visit_ClassDef_bases`).
ATTRIBUTE_METHOD = re.compile(r"^(visit|leave)_[A-Z][A-Za-z]*_[a-z_]+$")


def _attribute_hooks(kind: type[cst.CSTVisitor]) -> bool:
    """Whether visitors of this class act on attributes (`visit_ClassDef_bases`):
    whether a class between it and `CSTVisitor` defines such a method."""
    found = _HOOKS.get(kind)
    if found is None:
        found = _HOOKS[kind] = any(
            name in ("on_visit_attribute", "on_leave_attribute")
            or ATTRIBUTE_METHOD.match(name) is not None
            for klass in kind.__mro__
            if klass not in _BASES
            for name in vars(klass)
        )
    return found


#: The classes whose attribute methods do nothing (libcst's visitor bases).
_BASES = frozenset(cst.CSTVisitor.__mro__)


def findall(
    root: cst.CSTNode,
    kinds: type[N] | tuple[type[N], ...],
    where: Callable[[N], bool] | None = None,
) -> list[N]:
    """Every node of `kinds` under `root` (`root` included) for which `where` holds,
    in the order libcst visits them: `findall(f, cst.Call, calls_name)`.

    Plain `isinstance` tests and predicates rather than `libcst.matchers`: importing
    the matchers costs 0.12 s (a tenth of converting a module cold), and matching
    with them is several times slower than the tests they stand for.
    """
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    found: list[N] = []
    if not any(kind.__subclasses__() for kind in kinds):
        # Leaf classes: a set lookup by class, not `isinstance` through ABCMeta.
        leaves = frozenset(kinds)
        for node in nodes(root):
            if type(node) in leaves and (where is None or where(node)):  # type: ignore[arg-type]
                found.append(node)  # type: ignore[arg-type]
        return found
    for node in nodes(root):
        if isinstance(node, kinds) and (where is None or where(node)):
            found.append(node)
    return found


def is_name(node: object, value: str | None = None) -> TypeGuard[cst.Name]:
    """Whether `node` is a `Name` (spelled `value`, where given)."""
    # `type(...) is`: a leaf class, and `isinstance` goes through ABCMeta.
    return type(node) is cst.Name and (value is None or node.value == value)


def calls_name(node: object, value: str | None = None) -> TypeGuard[cst.Call]:
    """Whether `node` calls a bare name (`f(...)`; `range(...)` where `value` is
    "range")."""
    return type(node) is cst.Call and is_name(node.func, value)


def sole(line: object, kind: type[N]) -> N | None:
    """The small statement of a statement line that holds one, where it is a `kind`
    (`sole(line, cst.Return)` for a line `return ...`), else None."""
    if type(line) is not cst.SimpleStatementLine or len(line.body) != 1:
        return None
    only = line.body[0]
    return only if isinstance(only, kind) else None


def sole_target(node: object) -> cst.BaseAssignTargetExpression | None:
    """The target of an assignment to one target (`t = ...`, `a, b = ...`; not
    `a = b = ...`), else None."""
    if type(node) is not cst.Assign or len(node.targets) != 1:
        return None
    target: cst.BaseAssignTargetExpression = node.targets[0].target
    return target


def assigned_name(node: object) -> cst.Name | None:
    """The name an assignment to one name binds (`t = ...`), else None."""
    target = sole_target(node)
    return target if is_name(target) else None


def says_inplace(call: cst.Call) -> bool:
    """Whether a call passes `inplace=True` (`F.relu(t, inplace=True)`)."""
    return any(
        a.keyword is not None
        and a.keyword.value == "inplace"
        and isinstance(a.value, cst.Name)
        and a.value.value == "True"
        for a in call.args
    )


def binds_one_name(statement: object) -> bool:
    """Whether `statement` is a line that only binds one name: `x = ...`, `x: T =
    ...`."""
    assign = sole(statement, cst.Assign)
    if assign is not None:
        return assigned_name(assign) is not None
    annotated = sole(statement, cst.AnnAssign)
    return annotated is not None and is_name(annotated.target)
