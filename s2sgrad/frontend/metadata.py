"""libcst's metadata, resolved without rebuilding the tree.

`MetadataWrapper` resolves providers in batches: after the providers' own passes
(scopes and expression contexts do all their work from `visit_Module`), it visits
every node of the module with the batch's visitor methods, rebuilding each node as
libcst's `visit` does, and it does so even for a provider that is not batched at all
(positions). `Metadata` makes the same calls in the same order with
`s2sgrad.cst.walk`, and makes none where no method is left to call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack

import libcst as cst
from libcst import BatchableCSTVisitor, MetadataWrapper

from s2sgrad.cst import ATTRIBUTE_METHOD, walk

#: A batchable visitor's `visit_<Node>` or `leave_<Node>` method, bound.
VisitorMethod = Callable[[cst.CSTNode], None]


class Metadata(MetadataWrapper):
    """libcst's `MetadataWrapper`, whose batched pass (every provider's visit
    methods on every node, after the providers' own passes) walks the tree with
    `walk` instead of rebuilding each node: the same calls, in the same order."""

    def visit_batched(
        self,
        visitors: Iterable[BatchableCSTVisitor],
        before_visit: VisitorMethod | None = None,
        after_leave: VisitorMethod | None = None,
    ) -> cst.CSTNode:
        visitors = list(visitors)
        if not visitors and before_visit is None and after_leave is None:
            return self.module  # resolving a provider that is not batched
        with ExitStack() as stack:
            for visitor in visitors:
                stack.enter_context(visitor.resolve(self))
            methods: dict[str, list[VisitorMethod]] = {}
            for visitor in visitors:
                for name, method in _visitor_methods(visitor).items():
                    methods.setdefault(name, []).append(method)
            batched = (
                _BatchedAttributes
                if any(ATTRIBUTE_METHOD.match(name) for name in methods)
                else _Batched
            )(methods, before_visit, after_leave)
            if set(methods) <= _MODULE_ONLY and before_visit is after_leave is None:
                # Providers that do their work on the module (scopes, expression
                # contexts): no other node has a method to call.
                batched.on_visit(self.module)
                batched.on_leave(self.module)
            else:
                walk(self.module, batched)
        return self.module


_MODULE_ONLY = frozenset({"visit_Module", "leave_Module"})
_VISITOR_NAMES: dict[type[BatchableCSTVisitor], list[str]] = {}


def _visitor_methods(visitor: BatchableCSTVisitor) -> Mapping[str, VisitorMethod]:
    """`visitor.get_visitors()`, which lists the members of the visitor (slow, and
    the same for every visitor of a class): listed once per class, bound here."""
    names = _VISITOR_NAMES.get(type(visitor))
    if names is None:
        methods = visitor.get_visitors()
        _VISITOR_NAMES[type(visitor)] = list(methods)
        return methods
    return {name: getattr(visitor, name) for name in names}


class _Batched(cst.CSTVisitor):
    """Call the methods of several batchable visitors on each node."""

    def __init__(
        self,
        methods: dict[str, list[VisitorMethod]],
        before_visit: VisitorMethod | None,
        after_leave: VisitorMethod | None,
    ) -> None:
        self.methods = methods
        self.before_visit = before_visit
        self.after_leave = after_leave

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.before_visit is not None:
            self.before_visit(node)
        for method in self.methods.get("visit_" + type(node).__name__, ()):
            method(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for method in self.methods.get("leave_" + type(original_node).__name__, ()):
            method(original_node)
        if self.after_leave is not None:
            self.after_leave(original_node)


class _BatchedAttributes(_Batched):
    """`_Batched` for visitors that also act on attributes."""

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        for method in self.methods.get(f"visit_{type(node).__name__}_{attribute}", ()):
            method(node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        name = f"leave_{type(original_node).__name__}_{attribute}"
        for method in self.methods.get(name, ()):
            method(original_node)
