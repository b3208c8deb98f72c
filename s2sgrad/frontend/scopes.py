"""Resolve names with libcst's ScopeProvider: captures, globals, undefined names.

Takes a forward `FunctionDef`, its backward and the module's metadata; returns the
captures of backward (free names that resolve to the forward's scope, in order of first
reference, with how each use reads them), the module-level names the function needs,
and diagnostics for undefined names and for mutation of captured values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    BuiltinScope,
    CodeRange,
    GlobalScope,
    ImportAssignment,
    Scope,
)

from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.model import (
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    Capture,
    GlobalName,
    Use,
)


@dataclass(frozen=True)
class ScopeFacts:
    captures: tuple[Capture, ...]
    globals_used: tuple[str, ...]
    local_names: frozenset[str]
    diagnostics: tuple[Diagnostic, ...]


class ScopeAnalysis:
    """Answer scope questions about the functions of one module."""

    def __init__(
        self,
        scopes: Mapping[cst.CSTNode, Scope | None],
        parents: Mapping[cst.CSTNode, cst.CSTNode],
        positions: Mapping[cst.CSTNode, CodeRange],
        loc: Locator,
    ) -> None:
        self.scopes = scopes
        self.parents = parents
        self.positions = positions
        self.loc = loc
        self.all_scopes = {s for s in scopes.values() if s is not None}

    def scope_of(self, function: cst.FunctionDef) -> Scope:
        for scope in self.all_scopes:
            if getattr(scope, "node", None) is function:
                return scope
        raise AssertionError(f"no scope for {function.name.value}")

    def _within(self, root: Scope) -> Iterator[Scope]:
        for scope in self.all_scopes:
            walk: Scope | None = scope
            while walk is not None and not isinstance(
                walk, (GlobalScope, BuiltinScope)
            ):
                if walk is root:
                    yield scope
                    break
                walk = walk.parent

    def analyse(
        self, forward: cst.FunctionDef, backward: cst.FunctionDef
    ) -> ScopeFacts:
        fscope = self.scope_of(forward)
        bscope = self.scope_of(backward)
        inner = sorted(self._within(fscope), key=self._scope_order)
        uses: dict[str, list[Use]] = {}
        globals_used: dict[str, tuple[int, int]] = {}
        names: set[str] = set()
        found: list[Diagnostic] = []
        backward_scopes = set(self._within(bscope))
        for scope in inner:
            names.update(a.name for a in scope.assignments)
            for access in scope.accesses:
                node = access.node
                if not isinstance(node, cst.Name):
                    continue
                names.add(node.value)
                referents = access.referents
                if not referents:
                    found.append(self._undefined(node))
                    continue
                if scope in backward_scopes and any(
                    r.scope is fscope for r in referents
                ):
                    uses.setdefault(node.value, []).append(self._use(node))
                if any(isinstance(r.scope, GlobalScope) for r in referents):
                    globals_used.setdefault(node.value, self._pos(node))
        for node in _signature_names(forward):
            scope = self.scopes.get(node)
            if scope is None:
                continue
            for access in scope.accesses[node]:
                if not access.referents:
                    found.append(self._undefined(node))
                elif any(isinstance(r.scope, GlobalScope) for r in access.referents):
                    globals_used.setdefault(node.value, self._pos(node))
        captures = tuple(
            Capture(name, tuple(sorted(u, key=lambda use: self._pos(use.name))))
            for name, u in sorted(
                uses.items(), key=lambda kv: min(self._pos(x.name) for x in kv[1])
            )
        )
        found += self._mutations(forward, backward, captures)
        found.sort(key=lambda d: (d.line, d.column))
        ordered_globals = tuple(sorted(globals_used, key=lambda n: globals_used[n]))
        return ScopeFacts(captures, ordered_globals, frozenset(names), tuple(found))

    def _scope_order(self, scope: Scope) -> tuple[int, int]:
        node = getattr(scope, "node", None)
        return self._pos(node) if node is not None else (0, 0)

    def _pos(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.positions[node].start
        return (start.line, start.column)

    def _undefined(self, node: cst.Name) -> Diagnostic:
        return self.loc.error(
            "S2S112",
            node,
            f"undefined name `{node.value}`",
            "define or import it at module level",
        )

    def _use(self, name: cst.Name) -> Use:
        """Classify one read of a captured name: the value, or only its metadata."""
        parent = self.parents.get(name)
        line, column = self._pos(name)
        if isinstance(parent, cst.Attribute) and parent.value is name:
            attr = parent.attr.value
            if attr in METADATA_ATTRIBUTES:
                return Use(name, METADATA_ATTRIBUTES[attr], parent, None, line, column)
            call = self.parents.get(parent)
            if (
                attr in METADATA_METHODS
                and isinstance(call, cst.Call)
                and call.func is parent
            ):
                index = _size_index(call) if attr == "size" else None
                plain = not call.args
                if plain or (index is not None and len(call.args) == 1):
                    return Use(name, METADATA_METHODS[attr], call, index, line, column)
        return Use(name, None, name, None, line, column)

    def _mutations(
        self,
        forward: cst.FunctionDef,
        backward: cst.FunctionDef,
        captures: tuple[Capture, ...],
    ) -> list[Diagnostic]:
        """Diagnose in-place writes to captured values, in backward or after capture."""
        captured = {c.name for c in captures}
        params = {p.name.value for p in _all_params(forward)}
        found = []
        finder = _MutationFinder(captured | params, backward)
        forward.body.visit(finder)
        for node, name, in_backward in finder.hits:
            if in_backward and name not in captured:
                continue
            what = "a captured value" if name in captured else "an input"
            found.append(
                self.loc.error(
                    "S2S103",
                    node,
                    f"in-place mutation of {what}: `{name}`",
                    "use the out-of-place form (`x.add(y)` instead of `x.add_(y)`)",
                )
            )
        return found


def _size_index(call: cst.Call) -> cst.BaseExpression | None:
    if len(call.args) != 1:
        return None
    arg = call.args[0]
    if arg.keyword is None or arg.keyword.value == "dim":
        return arg.value
    return None


def _all_params(function: cst.FunctionDef) -> list[cst.Param]:
    p = function.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


def _signature_names(function: cst.FunctionDef) -> Iterator[cst.Name]:
    """Yield the names read by annotations and defaults (evaluated at module level)."""
    for param in _all_params(function):
        for part in (param.annotation, param.default):
            if part is not None:
                for name in m.findall(part, m.Name()):
                    assert isinstance(name, cst.Name)
                    yield name
    if function.returns is not None:
        for name in m.findall(function.returns, m.Name()):
            assert isinstance(name, cst.Name)
            yield name


class _MutationFinder(cst.CSTVisitor):
    """Find in-place method calls, item/attribute stores and `out=` on given names."""

    def __init__(self, names: set[str], backward: cst.FunctionDef) -> None:
        self.names = names
        self.backward = backward
        self.depth_in_backward = 0
        self.hits: list[tuple[cst.CSTNode, str, bool]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node is self.backward:
            self.depth_in_backward += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if original_node is self.backward:
            self.depth_in_backward -= 1

    def _hit(self, node: cst.CSTNode, target: cst.BaseExpression) -> None:
        base = target
        while isinstance(base, (cst.Subscript, cst.Attribute)):
            base = base.value
        if isinstance(base, cst.Name) and base.value in self.names:
            self.hits.append((node, base.value, self.depth_in_backward > 0))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            if attr.endswith("_") and not attr.startswith("_"):
                self._hit(node, func.value)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "out":
                self._hit(node, arg.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            for element in _flatten(target.target):
                if isinstance(element, (cst.Subscript, cst.Attribute)):
                    self._hit(node, element)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, (cst.Subscript, cst.Attribute)):
            self._hit(node, node.target)
        elif self.depth_in_backward and isinstance(node.target, cst.Name):
            self._hit(node, node.target)


def _flatten(target: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _flatten(element.value)
    else:
        yield target


def global_name(name: str, scope: GlobalScope) -> GlobalName:
    """Describe how the generated module gets a module-level `name`."""
    codes = []
    for assignment in sorted(scope.assignments[name], key=lambda a: _node_key(a.node)):
        if isinstance(assignment, ImportAssignment):
            codes.append(_import_code(name, assignment.node))
        else:
            return GlobalName(name, None)
    return GlobalName(name, "\n".join(dict.fromkeys(c for c in codes if c)))


def _node_key(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _import_code(name: str, node: cst.CSTNode) -> str:
    """Return an import statement that binds only `name`, taken from `node`."""
    code = cst.Module([]).code_for_node
    if isinstance(node, cst.Import):
        for alias in node.names:
            bound = alias.evaluated_alias or alias.evaluated_name.split(".")[0]
            if bound == name:
                return f"import {code(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))}"
    if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        module = code(node.module) if node.module is not None else ""
        dots = "." * len(node.relative)
        for alias in node.names:
            if (alias.evaluated_alias or alias.evaluated_name) == name:
                alias_code = code(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
                return f"from {dots}{module} import {alias_code}"
    return ""
