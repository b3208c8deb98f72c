"""Resolve names with libcst's ScopeProvider: captures, globals, undefined names.

Takes a forward `FunctionDef`, its backward and the module's metadata; returns the
captures of backward (free names that resolve to the forward's scope, in order of first
reference, with how each use reads them), the module-level names the function needs,
and diagnostics for undefined names and for mutation of captured values.
"""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import libcst as cst
from libcst.metadata import (
    Access,
    Assignment,
    BaseAssignment,
    BuiltinScope,
    CodeRange,
    FunctionScope,
    GlobalScope,
    ImportAssignment,
    Scope,
)

from s2sgrad import opfacts
from s2sgrad.cst import (
    assigned_name,
    dotted,
    findall,
    is_name,
    nodes,
    says_inplace,
    sole,
    walk,
)
from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.model import (
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    Capture,
    GlobalName,
    InPlace,
    Use,
)
from s2sgrad.sharing import CONTAINER_ADDS, may_share, shared_arguments


@dataclass(frozen=True)
class ScopeFacts:
    captures: tuple[Capture, ...]
    globals_used: tuple[str, ...]
    local_names: frozenset[str]
    diagnostics: tuple[Diagnostic, ...]
    writes: tuple[InPlace, ...] = ()
    #: Names bound in backward and used nowhere else: each one's Name nodes.
    backward_locals: Mapping[str, tuple[cst.Name, ...]] = dataclasses.field(
        default_factory=dict
    )


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
        # Indexes built once, so that each differentiator costs time in its own size
        # rather than in the size of the module.
        self.by_node: dict[cst.CSTNode, Scope] = {}
        self.children: dict[Scope, list[Scope]] = {}
        for scope in self.all_scopes:
            node = getattr(scope, "node", None)
            if node is not None and not isinstance(scope, GlobalScope):
                self.by_node[node] = scope
            if scope.parent is not scope:
                self.children.setdefault(scope.parent, []).append(scope)
        self.global_scope = next(
            s for s in self.all_scopes if isinstance(s, GlobalScope)
        )
        #: Module-level names bound by imports (`torch`, `F`): calls through them are
        #: library functions, so `torch.relu_(t)` mutates its argument `t`.
        self.imported = frozenset(
            a.name
            for a in self.global_scope.assignments
            if isinstance(a, ImportAssignment)
        )
        self._accesses: dict[cst.CSTNode, Access] | None = None
        #: Per module helper the differentiators call: its positional parameters,
        #: and those it changes in place (`learn_helpers`).
        self.helper_writes: dict[str, _HelperWrites] = {}
        #: The helpers that may hand back an argument (`learn_helpers`).
        self.handing_back: frozenset[str] = frozenset()

    def learn_helpers(
        self, helpers: Sequence[cst.FunctionDef], module: cst.Module | None = None
    ) -> None:
        """Find which parameters each helper changes in place: directly
        (`t.mul_(2)`, `t[0] = 0`, `out=t`), or by handing them to a helper that does.

        A call `_bump(u)` in forward then changes `u` as `u.mul_(2)` would, and is
        judged as that write is: an input's change is refused, a change of a value
        that carries a gradient cannot be written out of place (a helper's body is
        not rewritten) and is refused too; without it the promoted temporary's
        gradient missed the change and orders 2 and 3 were silently wrong.
        """
        helpers = [*helpers, *_stand_ins(module, helpers)] if module else helpers
        table = {
            h.name.value: _HelperWrites(_positional_names(h), frozenset())
            for h in helpers
        }
        for _ in range(len(helpers)):  # a helper's writes reach its callers
            changed = False
            for helper in helpers:
                names = {p.name.value for p in _all_params(helper)}
                renamed = _param_names(helper, names)
                for loop in findall(helper.body, cst.For, lambda f: is_name(f.iter)):
                    # `for z in ts: z.mul_(2)` writes the tensors `ts` holds.
                    assert isinstance(loop.iter, cst.Name)
                    owner = renamed.get(loop.iter.value, loop.iter.value)
                    if owner in names and isinstance(loop.target, cst.Name):
                        renamed[loop.target.value] = owner
                finder = _MutationFinder(None, self.imported, self._qualified, table)
                walk(helper.body, finder)
                written = (
                    frozenset(
                        renamed.get(hit.name, hit.name)
                        for hit in finder.hits
                        if hit.kind != "del"
                    )
                    & names
                )
                # `t *= 2.0` on a tensor parameter never bound again: in place.
                written |= _augmented_parameters(helper, finder.augmented)
                entry = table[helper.name.value]
                if written != entry.written:
                    table[helper.name.value] = entry._replace(written=written)
                    changed = True
            if not changed:
                break
        self.helper_writes = {n: w for n, w in table.items() if w.written}
        handing: set[str] = set()
        for _ in range(len(helpers)):  # `return _wrap(t)` hands back what `_wrap` does
            grown = {
                h.name.value
                for h in helpers
                if h.name.value not in handing
                and _hands_back(h, self._qualified, frozenset(handing))
            }
            if not grown:
                break
            handing |= grown
        self.handing_back = frozenset(handing)

    def _qualified(self, node: cst.CSTNode) -> str | None:
        """The one module-level qualified name `node` spells (`F.relu`:
        `torch.nn.functional.relu`), else None."""
        scope = self.scopes.get(node)
        if scope is None:
            return None
        names = {
            q.name
            for q in scope.get_qualified_names_for(node)
            if "<locals>" not in q.name
        }
        return names.pop() if len(names) == 1 else None

    def _access_of(self, node: cst.Name) -> Access | None:
        """The access recorded for this very node (`scope.accesses[node]` would give
        every access of the same name in the scope)."""
        if self._accesses is None:
            self._accesses = {
                a.node: a
                for scope in self.all_scopes
                if isinstance(scope, GlobalScope)
                for a in scope.accesses
            }
        return self._accesses.get(node)

    def scope_of(self, function: cst.FunctionDef) -> Scope:
        scope = self.by_node.get(function)
        if scope is None:
            raise AssertionError(f"no scope for {function.name.value}")
        return scope

    def _within(self, root: Scope) -> Iterator[Scope]:
        """Yield `root` and every scope nested in it."""
        stack = [root]
        while stack:
            scope = stack.pop()
            yield scope
            stack.extend(self.children.get(scope, ()))

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
                unbound = self._read_before_assignment(node, scope, referents)
                if unbound is not None:
                    found.append(unbound)
                    continue
                if not referents:
                    found.append(self._undefined(node, scope))
                    continue
                if scope in backward_scopes and any(
                    r.scope is fscope for r in referents
                ):
                    uses.setdefault(node.value, []).append(self._use(node))
                if any(isinstance(r.scope, GlobalScope) for r in referents):
                    globals_used.setdefault(node.value, self._pos(node))
        for node in _signature_names(forward):
            outer = self.scopes.get(node)
            read = self._access_of(node)
            if outer is None or read is None:
                continue
            if not read.referents:
                found.append(self._undefined(node, outer))
            elif any(isinstance(r.scope, GlobalScope) for r in read.referents):
                globals_used.setdefault(node.value, self._pos(node))
        for string, name in _string_annotation_names(forward):
            # `xs: "List[torch.Tensor]"`: the generated signature reads `List` too.
            outer = self.scopes.get(string)
            if isinstance(outer, GlobalScope) and outer.assignments[name]:
                globals_used.setdefault(name, self._pos(string))
        backward_locals = self._backward_locals(
            backward, bscope, inner, backward_scopes
        )
        captures = tuple(
            Capture(name, tuple(sorted(u, key=lambda use: self._pos(use.name))))
            for name, u in sorted(
                uses.items(), key=lambda kv: min(self._pos(x.name) for x in kv[1])
            )
        )
        finder = _MutationFinder(
            backward, self.imported, self._qualified, self.helper_writes
        )
        walk(forward.body, finder)
        found += self._augmented_before_assignment(finder.augmented)
        hits = _through_backward_aliases(
            finder.hits, backward, {c.name for c in captures}, self._qualified
        )
        problems, writes = self._mutations(forward, hits, captures)
        found += problems
        found += self._incoming_changed(backward, hits, finder.augmented)
        found.sort(key=lambda d: (d.line, d.column))
        ordered_globals = tuple(sorted(globals_used, key=lambda n: globals_used[n]))
        return ScopeFacts(
            captures,
            ordered_globals,
            frozenset(names),
            tuple(found),
            writes,
            backward_locals,
        )

    def _backward_locals(
        self,
        backward: cst.FunctionDef,
        bscope: Scope,
        inner: list[Scope],
        backward_scopes: set[Scope],
    ) -> dict[str, tuple[cst.Name, ...]]:
        """The names that backward binds (its parameters aside) and that nothing
        outside backward binds or reads, each with every Name node that spells it."""
        params = {p.name.value for p in _all_params(backward)}
        outside = {
            name
            for scope in inner
            if scope not in backward_scopes
            for name in (
                *(a.name for a in scope.assignments),
                *(a.node.value for a in scope.accesses if isinstance(a.node, cst.Name)),
            )
        }
        found: dict[str, list[cst.Name]] = {}
        for assignment in bscope.assignments:
            name = assignment.name
            if (
                name in params
                or name in outside
                or not isinstance(assignment, Assignment)
            ):
                continue
            if isinstance(assignment.node, cst.Name):
                found.setdefault(name, []).append(assignment.node)
        for scope in backward_scopes:
            for access in scope.accesses:
                node = access.node
                if not isinstance(node, cst.Name) or node.value not in found:
                    continue
                if any(r.scope is bscope for r in access.referents):
                    found[node.value].append(node)
        return {name: tuple(nodes) for name, nodes in sorted(found.items())}

    def _scope_order(self, scope: Scope) -> tuple[int, int]:
        node = getattr(scope, "node", None)
        return self._pos(node) if node is not None else (0, 0)

    def _pos(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.positions[node].start
        return (start.line, start.column)

    def _undefined(self, node: cst.Name, scope: Scope) -> Diagnostic:
        hint = "define or import it at module level"
        close = difflib.get_close_matches(
            node.value, sorted(self._visible(scope)), n=1, cutoff=0.75
        )
        starred = next(
            (m.group(1) for m in map(_STAR_IMPORT.match, self.loc.lines) if m), None
        )
        if close:
            hint = f"did you mean `{close[0]}`?"
        elif starred is not None:
            # An outside probe: `from torch import *` left `exp` "undefined" with
            # the hint to import it, which it was.
            hint = (
                f"s2sgrad cannot tell which names `from {starred} import *` binds: "
                f"import it by name (`from {starred} import {node.value}`)"
            )
        return self.loc.error("S2S112", node, f"undefined name `{node.value}`", hint)

    def _visible(self, scope: Scope) -> set[str]:
        """Names a read in `scope` may refer to: enclosing bindings and builtins."""
        names = set(dir(builtins))
        walk: Scope | None = scope
        while walk is not None and not isinstance(walk, BuiltinScope):
            names.update(a.name for a in walk.assignments)
            walk = None if walk.parent is walk else walk.parent
        return names

    def _local_lines(self, scope: Scope, name: str) -> list[int]:
        """Lines where function `scope` itself binds `name` (empty: not local)."""
        if not isinstance(scope, FunctionScope):
            return []
        return sorted(
            self.positions[a.node].start.line
            for a in scope.assignments[name]
            if isinstance(a, Assignment) and a.node in self.positions
        )

    def _read_before_assignment(
        self,
        node: cst.Name,
        scope: Scope,
        referents: Collection[BaseAssignment],
    ) -> Diagnostic | None:
        """Diagnose a read of a local name that comes before any local binding.

        Python decides per function which names are local: one assignment anywhere
        in a function makes the name local everywhere in it. libcst resolves a read
        that comes before the first local assignment to the enclosing function (or
        to nothing); at run time Python raises UnboundLocalError there instead.
        """
        lines = self._local_lines(scope, node.value)
        if not lines or any(r.scope is scope for r in referents):
            return None
        return self._unbound(node, node.value, scope, lines[0], bool(referents))

    def _augmented_before_assignment(
        self, augmented: list[cst.AugAssign]
    ) -> list[Diagnostic]:
        """Diagnose `t += ...` where `t` has no earlier binding in its function."""
        found = []
        for aug in augmented:
            assert isinstance(aug.target, cst.Name)
            scope = self.scopes.get(aug.target)
            if not isinstance(scope, FunctionScope):
                continue
            name = aug.target.value
            here = self._pos(aug)
            earlier = [
                a
                for a in scope.assignments[name]
                if isinstance(a, Assignment)
                and a.node in self.positions
                and self._pos(a.node) < here
            ]
            if earlier:
                continue
            if name in self._visible(scope.parent):
                found.append(self._rebinds_enclosing(aug, name, scope))
            else:
                found.append(self._unbound(aug.target, name, scope, here[0], False))
        return found

    def _rebinds_enclosing(
        self, aug: cst.AugAssign, name: str, scope: Scope
    ) -> Diagnostic:
        """Diagnose `t += ...` on a name of the enclosing function (no nonlocal)."""
        op = _code(aug.operator).strip()
        owner = getattr(getattr(scope, "node", None), "name", None)
        where = f"`{owner.value}`" if isinstance(owner, cst.Name) else "the function"
        return self.loc.error(
            "S2S117",
            aug.target,
            f"`{name} {op} ...` assigns `{name}` in {where}, which makes it local to "
            f"{where}, so it has no value yet: Python raises UnboundLocalError",
            f"bind a new name (`{name}_new = {name} {op[:-1]} ...`): backward must "
            "not rebind or mutate forward's variables",
        )

    def _unbound(
        self, node: cst.Name, name: str, scope: Scope, line: int, outer: bool
    ) -> Diagnostic:
        owner = getattr(getattr(scope, "node", None), "name", None)
        where = f"`{owner.value}`" if isinstance(owner, cst.Name) else "the function"
        if outer:
            message = (
                f"`{name}` is read here, but {where} assigns `{name}` (line {line}), "
                f"which makes it local to {where}: Python raises UnboundLocalError "
                f"instead of reading the enclosing function's `{name}`"
            )
            hint = (
                f"give the new value another name (`{name}_new = ...`): backward "
                "must not rebind forward's variables"
            )
        else:
            message = (
                f"`{name}` is read before it is assigned (line {line}): "
                "Python raises UnboundLocalError"
            )
            hint = f"assign `{name}` before this line"
        return self.loc.error("S2S117", node, message, hint)

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
        hits: list[_Hit],
        captures: tuple[Capture, ...],
    ) -> tuple[list[Diagnostic], tuple[InPlace, ...]]:
        """Diagnose in-place writes to inputs, and to captured values in backward or
        by `del`; return forward's writes to values it created, for lifting to judge
        (they are fine on values that carry no gradient)."""
        captured = {c.name for c in captures}
        params = {p.name.value for p in _all_params(forward)}
        renamed = _param_names(forward, params)
        found = []
        writes = []
        views = _input_views(forward, params, self._qualified)
        module_state = self._module_state(forward, params)
        for hit in hits:
            changed = (
                self._module_state_changed(forward, hit)
                if not hit.in_backward and hit.name in module_state
                else []
            )
            if changed:
                found += changed
                continue
            if hit.kind == "container" and not hit.in_backward:
                # `ys = xs; ys.append(y)` changes the input `xs`.
                hit = replace(hit, name=renamed.get(hit.name, hit.name))
            elif not hit.in_backward and hit.kind != "del" and hit.name in views:
                # `z = x.detach(); z.mul_(2)` changes the input `x`; so do
                # `parts = x.chunk(2); parts[0].mul_(2)` and `parts[0] += 1`, but
                # not `parts[0] = v`, which changes the list.
                owner, holder = views[hit.name]
                if not holder or hit.reaches_held():
                    hit = replace(hit, name=owner)
            if hit.in_backward or hit.kind == "del":
                if hit.name not in captured:
                    continue
            elif hit.name not in params:
                if hit.kind == "container":
                    continue  # a list or dict forward builds
                line, column = self._pos(hit.node)
                writes.append(
                    InPlace(
                        hit.name,
                        hit.node,
                        hit.kind,
                        hit.code,
                        line,
                        column + 1,
                        hit.depth,
                    )
                )
                continue
            what = (
                f"the input `{hit.name}`"
                if hit.name in params and not hit.in_backward
                else f"the captured value `{hit.name}`"
            )
            message, hint = _describe(hit, what)
            found.append(self.loc.error("S2S103", hit.node, message, hint))
        return found, tuple(writes)

    def _module_state(self, forward: cst.FunctionDef, params: set[str]) -> set[str]:
        """The module-level names forward uses without binding them itself."""
        scope = self.scope_of(forward)
        local = {a.name for a in scope.assignments} | params
        return {a.name for a in self.global_scope.assignments} - local

    def _module_state_changed(
        self, forward: cst.FunctionDef, hit: _Hit
    ) -> list[Diagnostic]:
        """S2S131 where forward changes a module-level object that it also reads
        elsewhere (`h = x * CFG["scale"]`, then `CFG["scale"] = 3.0`): backward's
        code for higher orders, and a loop it recomputes, read forward's values
        from the module again, after the change. A change alone (`STATS.append(v)`)
        is forward's own business."""
        statement = self.parents.get(hit.node)
        while statement is not None and not isinstance(
            statement, cst.SimpleStatementLine
        ):
            statement = self.parents.get(statement)
        inside = set(nodes(statement)) if statement is not None else {hit.node}
        reads = [
            n
            for n in nodes(forward.body)
            if isinstance(n, cst.Name) and n.value == hit.name and n not in inside
        ]
        if not reads:
            return []
        return [
            self.loc.error(
                "S2S131",
                hit.node,
                f"`{hit.code}` changes the module-level `{hit.name}`, which forward "
                "also reads: the code s2sgrad writes for higher orders reads it "
                "again in backward, after the change",
                f"pass what forward reads of `{hit.name}` as a parameter, or change "
                "it outside the differentiator",
            )
        ]

    def _incoming_changed(
        self,
        backward: cst.FunctionDef,
        hits: list[_Hit],
        augmented: list[cst.AugAssign],
    ) -> list[Diagnostic]:
        """Diagnose an in-place change of an incoming gradient in backward (`g.mul_(y)`,
        `g[m] = 0`, `g *= 2`): autograd hands backward a tensor it may share (the
        gradient of a `sum` is one number, expanded), so the write fails there, and
        otherwise changes the caller's `grad_outputs`. A backward that rebinds the
        name (`g = g.clone()`) is not judged."""
        incoming = {p.name.value for p in backward.params.params}
        incoming -= {
            t.value
            for a in findall(backward.body, cst.Assign)
            for t in (x.target for x in a.targets)
            if isinstance(t, cst.Name)
        }
        # `out = [g, g]; out[0][:] = 0` changes `g` through the list: a store
        # below an item (inplace.py judges the writes to names and their items).
        nested = any(h.in_backward and h.kind == "store" and h.depth >= 2 for h in hits)
        views = _input_views(backward, incoming, self._qualified) if nested else {}
        found = []
        for hit in hits:
            if not hit.in_backward or hit.kind == "container":
                continue
            if hit.name in incoming:
                gradient = hit.name
            elif hit.name in views and hit.kind == "store" and hit.depth >= 2:
                gradient = views[hit.name][0]
            else:
                continue
            named = replace(hit, name=gradient)
            message, hint = _describe(named, f"the incoming gradient `{gradient}`")
            found.append(self.loc.error("S2S103", hit.node, message, hint))
        inside = set(nodes(backward))
        for aug in augmented:
            target = aug.target
            if (
                aug in inside
                and isinstance(target, cst.Name)
                and target.value in incoming
            ):
                op = _code(aug.operator).strip()[:-1]
                found.append(
                    self.loc.error(
                        "S2S103",
                        aug,
                        f"`{target.value} {op}= ...` changes the incoming gradient "
                        f"`{target.value}` in place",
                        f"write `{target.value} = {target.value} {op} ...`, a new "
                        "tensor",
                    )
                )
        return found


def _param_names(forward: cst.FunctionDef, params: set[str]) -> dict[str, str]:
    """The names forward binds to a parameter's object itself (`ys = xs`), each with
    that parameter."""
    bound = {
        (target.value, a.value.value)
        for a in findall(forward.body, cst.Assign)
        if (target := assigned_name(a)) is not None and isinstance(a.value, cst.Name)
    }
    found = {name: name for name in params}
    for _ in range(len(bound)):
        grown = {t: found[v] for t, v in bound if v in found and t not in found}
        if not grown:
            break
        found.update(grown)
    return {name: p for name, p in found.items() if name not in params}


def _input_views(
    forward: cst.FunctionDef,
    params: set[str],
    qualified: Callable[[cst.CSTNode], str | None],
) -> dict[str, tuple[str, bool]]:
    """The names forward binds once, to a parameter's tensor or a view of it (`z =
    x.detach()`, `v = x[0]`, `w = z.view(-1)`), or to a container of such views
    (`parts = x.chunk(2)`, `hs = [x]`): each with that parameter, and whether it is
    a container. A write through one changes the caller's tensor. A name bound more
    than once is left out (`h = x; h = h * w` makes `h` a new tensor before any
    write to it)."""
    counts: dict[str, int] = {}
    single: dict[str, cst.BaseExpression] = {}
    for node in findall(
        forward.body,
        (cst.Assign, cst.AnnAssign, cst.For, cst.WithItem, cst.NamedExpr),
    ):
        targets: list[cst.BaseExpression]
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.WithItem):
            targets = [node.asname.name] if node.asname is not None else []
        else:
            assert isinstance(node, (cst.AnnAssign, cst.For, cst.NamedExpr))
            targets = [node.target]
        for target in targets:
            for element in _flatten(target):
                if isinstance(element, cst.Name):
                    counts[element.value] = counts.get(element.value, 0) + 1
            if isinstance(node, cst.Assign) and len(targets) == 1:
                for name, part in _paired(target, node.value):
                    single[name] = part
    found: dict[str, tuple[str, bool]] = {}
    for _ in range(len(single) + 1):
        grown = False
        for name, value in single.items():
            if name in found or name in params or counts.get(name) != 1:
                continue
            owner = next(
                (
                    found[n][0] if n in found else n
                    for n in [*params, *found]
                    if may_share(value, n, qualified)
                ),
                None,
            )
            if owner is not None:
                found[name] = (owner, _holder(value))
                grown = True
        if not grown:
            break
    return found


#: Tensor methods that return a tuple of views.
_SPLITTERS = frozenset({"chunk", "split", "unbind", "tensor_split", "split_with_sizes"})


#: Displays and comprehensions: each makes a new container.
_DISPLAYS = (
    cst.List,
    cst.Tuple,
    cst.Set,
    cst.Dict,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
)


def _holder(value: cst.BaseExpression) -> bool:
    """Whether `value` makes a container (`[x]`, `x.chunk(2)`, `list(...)`), whose
    own items a store replaces, rather than a tensor."""
    if isinstance(
        value,
        (
            *_DISPLAYS,
            cst.GeneratorExp,
            cst.BinaryOperation,
        ),
    ):
        return True
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Name):
            return func.value in ("list", "tuple", "dict", "set", "sorted", "reversed")
        if isinstance(func, cst.Attribute):
            return func.attr.value in _SPLITTERS
    return False


def _paired(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[str, cst.BaseExpression]]:
    """Each name `target = value` binds, with the part of `value` it gets: `a, b =
    t, g` pairs `a` with `t`; unpacking anything else pairs every name with all of
    `value` (it may be any part of it); a subscript or attribute target binds no
    name."""
    if isinstance(target, cst.Name):
        return [(target.value, value)]
    if isinstance(target, (cst.Tuple, cst.List)):
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and len(value.elements) == len(target.elements)
            and not any(isinstance(e, cst.StarredElement) for e in target.elements)
        ):
            return [
                pair
                for t, v in zip(target.elements, value.elements, strict=True)
                for pair in _paired(t.value, v.value)
            ]
        return [
            (element.value, value)
            for element in _flatten(target)
            if isinstance(element, cst.Name)
        ]
    return []


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
                yield from findall(part, cst.Name)
    if function.returns is not None:
        yield from findall(function.returns, cst.Name)


def _string_annotation_names(
    function: cst.FunctionDef,
) -> Iterator[tuple[cst.SimpleString, str]]:
    """Yield each parameter annotation written as a string, with a name it reads."""
    for param in _all_params(function):
        string = param.annotation.annotation if param.annotation else None
        if not isinstance(string, cst.SimpleString):
            continue
        text = string.evaluated_value
        try:
            parsed = cst.parse_expression(text if isinstance(text, str) else "")
        except cst.ParserSyntaxError:
            continue
        for name in findall(parsed, cst.Name):
            yield string, name.value


class _HelperWrites(NamedTuple):
    """A module helper's positional parameters, in order, and the parameters it
    changes in place."""

    positional: tuple[str, ...]
    written: frozenset[str]


#: A module-level star import, and the module it imports from.
_STAR_IMPORT = re.compile(r"from\s+([\w.]+)\s+import\s+\*")


def _through_backward_aliases(
    hits: list[_Hit],
    backward: cst.FunctionDef,
    captured: set[str],
    qualified: Callable[[cst.CSTNode], str | None],
) -> list[_Hit]:
    """`hits` with a write in backward to a name that may share a captured value's
    tensor (`a = u.view(-1)`, `a = u`, `parts = [u]`) read as a write to that value:
    `a.mul_(1)` changes `u`, which backward's second run (or a double backward)
    then finds changed, a RuntimeError at call time."""
    shared: dict[str, str] = {}
    #: Names bound to a new container that holds a captured value (`hs = [u]`):
    #: `hs.append(g)` and `hs[0] = g` change the list, not `u`.
    holders: set[str] = set()
    # Each binding, and whether a display bound there makes a holder: `for a in
    # [u]:` makes `a` u itself.
    assigns: list[tuple[list[cst.BaseExpression], cst.BaseExpression, bool]] = [
        (
            ([t.target for t in a.targets], a.value, True)
            if isinstance(a, cst.Assign)
            else ([a.target], a.iter, False)
        )
        for a in findall(backward.body, (cst.Assign, cst.For))
        if isinstance(a, (cst.Assign, cst.For))
    ]
    for call in findall(backward.body, cst.Call, _calls_method_of_name):
        # `hs.update(a=u)`, `hs.append(u)`: `hs` now holds u.
        assert isinstance(call.func, cst.Attribute)
        if call.func.attr.value in CONTAINER_ADDS:
            held = cst.Tuple([cst.Element(a.value) for a in call.args])
            assigns.append(([call.func.value], held, True))
    for _ in range(len(assigns) + 1):
        grown = False
        for targets, value, holds in assigns:
            for target in targets:
                for name, part in _paired(target, value):
                    if name in shared or name in captured:
                        continue
                    owner = next(
                        (
                            shared.get(c, c)
                            for c in [*captured, *shared]
                            if may_share(part, c, qualified)
                        ),
                        None,
                    )
                    if owner is not None:
                        shared[name] = owner
                        if holds and isinstance(part, _DISPLAYS):
                            holders.add(name)  # a new list holding `u`, not `u`
                        grown = True
        if not grown:
            break
    return [
        (
            replace(hit, name=shared[hit.name])
            if hit.in_backward
            and hit.kind != "del"
            and hit.name in shared
            and not (hit.name in holders and not hit.reaches_held())
            else hit
        )
        for hit in hits
    ]


def _calls_method_of_name(call: cst.Call) -> bool:
    """Whether a call is of an attribute of a bare name (`hs.append(u)`)."""
    return isinstance(call.func, cst.Attribute) and is_name(call.func.value)


def _stand_ins(
    module: cst.Module, helpers: Sequence[cst.FunctionDef]
) -> list[cst.FunctionDef]:
    """A `def` for each module-level name bound to a lambda (`_ml = lambda z: z`) or
    to another helper (`_b2 = _bump`), so that what it writes and hands back is read
    as a helper's is: `def _ml(z): return z`, `def _b2(t): return _bump(t)`."""
    known = {h.name.value for h in helpers}
    defs = {h.name.value: h for h in helpers}
    defs.update(
        (s.name.value, s) for s in module.body if isinstance(s, cst.FunctionDef)
    )
    found: list[cst.FunctionDef] = []
    for statement in module.body:
        # A line `name = ...` alone.
        assign = sole(statement, cst.Assign)
        target = assigned_name(assign)
        if assign is None or target is None:
            continue
        value = assign.value
        if isinstance(value, cst.Lambda):
            body: cst.BaseExpression = value.body
            params = value.params
        elif isinstance(value, cst.Name) and value.value in defs:
            if value.value not in known:  # called by its alias only
                known.add(value.value)
                found.append(defs[value.value])
            params = defs[value.value].params
            names = [p.name.value for p in (*params.posonly_params, *params.params)]
            body = cst.parse_expression(f"{value.value}({', '.join(names)})")
        else:
            continue
        stand_in = cst.FunctionDef(
            name=target,
            params=params,
            body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Return(body)])]),
        )
        defs[target.value] = stand_in
        found.append(stand_in)
    return found


def _augmented_parameters(
    helper: cst.FunctionDef, augmented: Sequence[cst.AugAssign]
) -> frozenset[str]:
    """The parameters a helper changes by `p op= ...` and never binds anew: Python
    changes a tensor in place there. A parameter annotated as a number is left out
    (`k += 1` makes a new int)."""
    rebound = {
        element.value
        for a in findall(helper.body, (cst.Assign, cst.AnnAssign, cst.For))
        if isinstance(a, (cst.Assign, cst.AnnAssign, cst.For))
        for target in (
            [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
        )
        for element in _flatten(target)
        if isinstance(element, cst.Name)
    }
    numbers = {
        p.name.value
        for p in _all_params(helper)
        if p.annotation is not None
        and cst.Module([]).code_for_node(p.annotation.annotation)
        in ("int", "float", "bool", "complex")
    }
    params = {p.name.value for p in _all_params(helper)} - numbers - rebound
    return frozenset(
        a.target.value
        for a in augmented
        if isinstance(a.target, cst.Name) and a.target.value in params
    )


def _hands_back(
    helper: cst.FunctionDef,
    qualified: Callable[[cst.CSTNode], str | None],
    handing: frozenset[str],
) -> bool:
    """Whether `helper` may return one of its parameters' objects, a part or view of
    one, or a container holding one (`return t`, `return [t]`, `out.append(t)`)."""
    flow = _Carriers(qualified, handing)
    flow.block(_body(helper.body), {p.name.value for p in _all_params(helper)})
    return flow.found


class _Carriers:
    """Follow, statement by statement, the names that may carry a helper's parameter:
    a binding to a value that may share one adds its names, a binding to a new value
    (`out = out * v`) removes them; the two sides of an `if` join, and a loop joins
    with the state before it unless it surely runs (`for _ in range(2)`). `found`
    says whether a `return` may hand a carrier back."""

    def __init__(
        self, qualified: Callable[[cst.CSTNode], str | None], handing: frozenset[str]
    ) -> None:
        self.qualified = qualified
        self.handing = handing
        self.found = False

    def shares(self, value: cst.BaseExpression, carriers: set[str]) -> bool:
        return any(may_share(value, c, self.qualified, self.handing) for c in carriers)

    def block(
        self, statements: Sequence[cst.BaseStatement], carriers: set[str]
    ) -> set[str]:
        for statement in statements:
            carriers = self.statement(statement, carriers)
        return carriers

    def statement(self, statement: cst.BaseStatement, carriers: set[str]) -> set[str]:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                carriers = self.small(small, carriers)
            return carriers
        if isinstance(statement, cst.If):
            then = self.block(_body(statement.body), set(carriers))
            orelse = statement.orelse
            if isinstance(orelse, cst.If):
                return then | self.statement(orelse, set(carriers))
            if isinstance(orelse, cst.Else):
                return then | self.block(_body(orelse.body), set(carriers))
            return then | carriers
        if isinstance(statement, (cst.For, cst.While)):
            return self.loop(statement, carriers)
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            return carriers  # its returns are its own
        # `with`, `try`: each block may run, in order, or not.
        after = set(carriers)
        for node in nodes(statement):
            if isinstance(node, cst.IndentedBlock):
                after |= self.block(list(node.body), set(after))
        return after

    def loop(self, loop: cst.For | cst.While, carriers: set[str]) -> set[str]:
        entry, state = set(carriers), set(carriers)
        out = state
        for _ in range(8):  # each round can only add names: few rounds settle it
            inside = set(state)
            if isinstance(loop, cst.For):
                inside = self.bind([loop.target], loop.iter, inside)
            out = self.block(_body(loop.body), inside)
            grown = entry | out
            if grown == state:
                break
            state = grown
        surely = isinstance(loop, cst.For) and _runs(loop.iter)
        after = out if surely else entry | out
        if loop.orelse is not None:
            after = self.block(_body(loop.orelse.body), after)
        return after

    def small(self, small: cst.BaseSmallStatement, carriers: set[str]) -> set[str]:
        if isinstance(small, cst.Return):
            if small.value is not None and self.shares(small.value, carriers):
                self.found = True
            return carriers
        if isinstance(small, cst.Assign):
            return self.bind([t.target for t in small.targets], small.value, carriers)
        if isinstance(small, cst.AnnAssign) and small.value is not None:
            return self.bind([small.target], small.value, carriers)
        if isinstance(small, cst.AugAssign):
            # `out += [t]` adds to what `out` holds; `out += 1` keeps its object.
            base = _base_name(small.target)
            if base is not None and self.shares(small.value, carriers):
                return carriers | {base}
            return carriers
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            func = small.value.func
            if isinstance(func, cst.Attribute) and func.attr.value in CONTAINER_ADDS:
                base = _base_name(func.value)
                added = cst.Tuple([cst.Element(a.value) for a in small.value.args])
                if base is not None and self.shares(added, carriers):
                    return carriers | {base}
        return carriers

    def bind(
        self,
        targets: Sequence[cst.BaseExpression],
        value: cst.BaseExpression,
        carriers: set[str],
    ) -> set[str]:
        shares = self.shares(value, carriers)
        after = set(carriers)
        for target in targets:
            for element in _flatten(target):
                if isinstance(element, cst.Name):
                    if shares:
                        after.add(element.value)
                    else:
                        after.discard(element.value)  # a new value
                elif shares and (base := _base_name(element)) is not None:
                    after.add(base)  # `out[0] = t`: out now holds it
        return after


def _body(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    assert isinstance(suite, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(suite.body)]


def _runs(iterable: cst.BaseExpression) -> bool:
    """Whether a `for` over `iterable` surely runs its body: `range(n)` or
    `range(a, b)` of literals that make it non-empty."""
    if not (
        isinstance(iterable, cst.Call)
        and is_name(iterable.func, "range")
        and 1 <= len(iterable.args) <= 2
        and all(
            isinstance(a.value, cst.Integer) and a.keyword is None
            for a in iterable.args
        )
    ):
        return False
    bounds = [
        int(a.value.value) for a in iterable.args if isinstance(a.value, cst.Integer)
    ]
    start, stop = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
    return stop > start


def _positional_names(function: cst.FunctionDef) -> tuple[str, ...]:
    p = function.params
    return tuple(x.name.value for x in (*p.posonly_params, *p.params))


@dataclass(frozen=True)
class _Hit:
    """One in-place write found by `_MutationFinder`."""

    node: cst.CSTNode  # where the caret goes
    name: str  # the variable whose value changes
    in_backward: bool
    #: method (`t.add_()`), function (`torch.relu_(t)`), inplace (`inplace=True`),
    #: container (`calls.append(x)`, in backward),
    #: out (`out=t`), store (`t[0] = 0`, `t.data = ...`, `t[0] += 1`, `del t[0]`),
    #: del (`del t`) or helper (`_bump(t)`, a module function that changes the
    #: parameter it is given in place).
    kind: str
    #: The code that mutates, as written: `t.add_`, `torch.relu_`, `t[0]`.
    code: str
    #: How many subscripts, attributes and views the write goes through to its
    #: variable: 0 for `t.add_()`, 1 for `t[0] = 0` and `keep[0].mul_()`.
    depth: int = 0
    #: A store `t[0] op= v`, which changes the value `t[0]` holds in place first.
    augmented: bool = False

    def reaches_held(self) -> bool:
        """Whether the write changes a tensor its variable holds as an element (`hs
        = [x]`): `hs[0].mul_(2)` and `hs[0] += 1` do, `hs[0] = v` replaces it."""
        return self.depth >= (2 if self.kind == "store" and not self.augmented else 1)


#: Methods that change a list, dict or set in place (tensors have none of them).
_CONTAINER_MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "remove",
        "clear",
        "update",
        "setdefault",
        "popitem",
        "discard",
        "reverse",
    }
)

#: Out-of-place forms that are not the in-place name without its underscore.
_OUT_OF_PLACE = {
    "zero_": "`torch.zeros_like({})`",
    "fill_": "`torch.full_like({}, value)`",
    "copy_": "the source tensor itself (or its `.clone()`)",
    "requires_grad_": "a detached copy, `{}.detach()`,",
}


def _describe(hit: _Hit, what: str) -> tuple[str, str]:
    """Return the message and the hint for one in-place write."""
    name = hit.name
    if hit.kind == "function" and hit.code.count(".") > 1:
        # `nn.init.zeros_(w)` and the like have no out-of-place twin.
        return (
            f"`{hit.code}(...)` mutates {what} in place",
            f"apply it to a copy instead (`{name}_new = {name}.clone()`)",
        )
    if hit.kind in ("method", "function"):
        method = hit.code.rsplit(".", 1)[-1]
        special = _OUT_OF_PLACE.get(method)
        plain = special.format(name) if special else f"`{hit.code[:-1]}(...)`"
        return (
            f"`{hit.code}(...)` mutates {what} in place",
            f"use {plain} instead and bind the result to a new name",
        )
    if hit.kind == "container":
        why = (
            "backward must not change forward's values"
            if hit.in_backward
            else "the caller's list would change with it"
        )
        return (
            f"`{hit.code}(...)` changes {what} in place",
            f"build a new value instead (`{name}_new = [*{name}, item]`, "
            f"`{{**{name}, key: value}}`): {why}",
        )
    if hit.kind == "helper":
        return (
            f"`{hit.code}(...)` changes {what} in place: the helper `{hit.code}` "
            "writes to the parameter it is given",
            f"have `{hit.code}` compute the new value out of place and return it, "
            f"and bind the result to a new name (`{name}_new = {hit.code}(...)`)",
        )
    if hit.kind == "inplace":
        return (
            f"`{hit.code}(..., inplace=True)` mutates {what} in place",
            "drop `inplace=True` and bind the result to a new name",
        )
    if hit.kind == "out":
        return (
            f"`out={hit.code}` writes the result into {what}",
            "drop `out=` and bind the result to a new name",
        )
    if hit.kind == "del" and hit.in_backward:
        return (
            f"`del {name}` makes `{name}` local to backward, so backward cannot "
            f"read {what}: Python raises UnboundLocalError",
            f"remove `del {name}`",
        )
    if hit.kind == "del":
        return (
            f"`del {name}` deletes {what}, which backward reads when it runs",
            f"remove `del {name}`",
        )
    return (
        f"`{hit.code}` changes {what} in place",
        f"change a copy instead (`{name}_new = {name}.clone()`), or build the new "
        "value out of place (`torch.where`, `index_put`, `scatter`)",
    )


class _MutationFinder(cst.CSTVisitor):
    """Find in-place calls, item/attribute stores, `del` and `out=` on given names."""

    def __init__(
        self,
        backward: cst.FunctionDef | None,
        imported: frozenset[str],
        qualified: Callable[[cst.CSTNode], str | None],
        helpers: Mapping[str, _HelperWrites],
    ) -> None:
        self.backward = backward
        self.imported = imported
        self.qualified = qualified
        self.helpers = helpers
        self.depth_in_backward = 0
        self.hits: list[_Hit] = []
        #: `name += ...` statements, for the read-before-assignment check.
        self.augmented: list[cst.AugAssign] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node is self.backward:
            self.depth_in_backward += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if original_node is self.backward:
            self.depth_in_backward -= 1

    def _hit(
        self,
        node: cst.CSTNode,
        target: cst.BaseExpression,
        kind: str,
        code: str | None = None,
        augmented: bool = False,
    ) -> None:
        shown = code if code is not None else _code(target)
        inside = self.depth_in_backward > 0
        for base, depth in _bases(target, self.qualified):
            self.hits.append(_Hit(node, base, inside, kind, shown, depth, augmented))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        positional = [a for a in node.args if a.keyword is None and not a.star]
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            if attr == "requires_grad_" and not isinstance(func.value, cst.Name):
                # A flag of the new tensor object `x.detach()` makes, not of `x`.
                pass
            elif attr.endswith("_") and not attr.startswith("_"):
                if self._library(func.value):
                    # `torch.relu_(t)`, `nn.init.zeros_(w)`: the first argument.
                    if positional:
                        self._hit(node, positional[0].value, "function", _code(func))
                else:
                    self._hit(node, func.value, "method", _code(func))
            elif attr in _CONTAINER_MUTATORS:
                # Building a list in forward is fine (backward sees the final
                # value, as saved); changing an input's, or one in backward, is not.
                self._hit(node, func.value, "container", _code(func))
        flag = self._positional_inplace(node, positional)
        if flag is not None:
            self._hit(flag, positional[0].value, "inplace", _code(func))
        if isinstance(func, cst.Call) and positional and says_inplace(func):
            # `nn.ReLU(inplace=True)(t)`: the module made there changes `t`.
            self._hit(func, positional[0].value, "inplace", _code(func.func))
        helper = self.helpers.get(func.value) if isinstance(func, cst.Name) else None
        if helper is not None:
            # `_bump(u)`, where `_bump` changes the parameter `u` is given for.
            for i, arg in enumerate(node.args):
                if arg.star:
                    continue
                if arg.keyword is not None:
                    param: str | None = arg.keyword.value
                elif i < len(helper.positional):
                    param = helper.positional[i]
                else:
                    param = None
                if param in helper.written:
                    value = arg.value
                    # `_bump_all([t, u])`: the helper writes through the list.
                    parts = (
                        [e.value for e in value.elements]
                        if isinstance(value, (cst.List, cst.Tuple))
                        else [value]
                    )
                    for part in parts:
                        self._hit(arg, part, "helper", _code(func))
        for arg in node.args:
            if arg.keyword is None:
                continue
            if arg.keyword.value == "out":
                self._hit(arg, arg.value, "out")
            elif (
                arg.keyword.value == "inplace"
                and is_name(arg.value, "True")
                and positional
            ):
                self._hit(arg, positional[0].value, "inplace", _code(func))

    def _library(self, node: cst.BaseExpression) -> bool:
        """Whether `node` names something of an imported module (`torch`,
        `F.relu`), not a value made by a call (`F.dropout(t)`)."""
        return dotted(node) and _base_name(node) in self.imported

    def _positional_inplace(
        self, node: cst.Call, positional: list[cst.Arg]
    ) -> cst.Arg | None:
        """The argument `True` given positionally to a library function's `inplace`
        parameter (`F.leaky_relu(t, 0.1, True)`), by the function's signature."""
        if not positional or not self._library(node.func):
            return None
        name = self.qualified(node.func)
        for signature in opfacts.signatures(name) if name else ():
            plain = [p.name for p in signature.params if not p.keyword_only]
            at = plain.index("inplace") if "inplace" in plain else len(positional)
            if at < len(positional) and is_name(positional[at].value, "True"):
                return positional[at]
        return None

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            for element in _flatten(target.target):
                if isinstance(element, (cst.Subscript, cst.Attribute)):
                    self._hit(element, element, "store", f"{_code(element)} = ...")

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if isinstance(node.target, (cst.Subscript, cst.Attribute)):
            code = f"{_code(node.target)} = ..."
            self._hit(node.target, node.target, "store", code)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self.augmented.append(node)
        if isinstance(node.target, (cst.Subscript, cst.Attribute)):
            op = _code(node.operator).strip()
            code = f"{_code(node.target)} {op} ..."
            self._hit(node.target, node.target, "store", code, augmented=True)

    def visit_Del(self, node: cst.Del) -> None:
        for element in _flatten(node.target):
            if isinstance(element, cst.Name):
                self._hit(node, element, "del")
            elif isinstance(element, (cst.Subscript, cst.Attribute)):
                self._hit(node, element, "store", f"del {_code(element)}")


_Qualified = Callable[[cst.CSTNode], str | None]


def _down(
    target: cst.BaseExpression, qualified: _Qualified | None = None
) -> list[tuple[cst.BaseExpression, int]]:
    """What `target` is a part or view of, and through how many parts: one base for
    most, one per tensor argument of an op that may share any of them
    (`torch.broadcast_tensors(a, b)[1]`). `qualified` names the callees (`F.dropout`
    is `torch.nn.functional.dropout`); without it a callee is read as written."""
    depth = 0
    while True:
        if isinstance(target, (cst.Subscript, cst.Attribute)):
            target = target.value
        elif isinstance(target, cst.Call) and (inner := _viewed(target, qualified)):
            if len(inner) > 1:
                return [
                    (b, depth + 1 + d) for i in inner for b, d in _down(i, qualified)
                ]
            target = inner[0]
        else:
            return [(target, depth)]
        depth += 1


def _bases(target: cst.BaseExpression, qualified: _Qualified) -> list[tuple[str, int]]:
    """The variables whose memory a write through `target` changes, each with how
    many parts below it the target is."""
    found = _down(target, qualified)
    return [(b.value, d) for b, d in found if isinstance(b, cst.Name)]


def _base_name(target: cst.BaseExpression) -> str | None:
    """Return `t` for `t`, `t[0]`, `t.data`, `t.data[0]`, and for a view of it
    (`t.diagonal()`, `t.view(-1)[0]`, `torch.narrow(t, 0, 0, 1)`): the variable whose
    memory a write through the target changes. None for other targets (and for a
    view that may be of any of several, which `_bases` lists)."""
    bases = _down(target)
    base = bases[0][0]
    return base.value if len(bases) == 1 and isinstance(base, cst.Name) else None


def _viewed(
    call: cst.Call, qualified: _Qualified | None = None
) -> list[cst.BaseExpression]:
    """The tensors whose memory `call`'s result may share: the receiver of a view
    method (`t.diagonal()`), the first argument of a torch view function
    (`torch.narrow(t, ...)`, `F.dropout(t)`), every argument of one that may share
    any (`torch.einsum("ij->ji", t)`); none for a call that makes a new value."""
    func = call.func
    if isinstance(func, cst.Call):
        return [func]  # `getattr(t, "view")(-1)`: what the callee is bound to
    if is_name(func, "getattr") and call.args:
        return [call.args[0].value]
    if not isinstance(func, cst.Attribute):
        return []
    code = qualified(func) if qualified is not None else None
    if code is None:
        code = _code(func)
        code = code if code.startswith("torch.") and code.count(".") == 1 else None
    if code is not None and code.startswith("torch."):
        return shared_arguments(call, code)
    if opfacts.may_share_memory(f"torch.Tensor.{func.attr.value}"):
        return [func.value]
    return []


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _flatten(target: cst.BaseExpression) -> Iterator[cst.BaseExpression]:
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _flatten(element.value)
    else:
        yield target


def global_name(name: str, scope: GlobalScope) -> GlobalName:
    """Describe how the generated module gets a module-level `name`."""
    codes = []
    for assignment in sorted(scope.assignments[name], key=_assignment_key):
        if isinstance(assignment, ImportAssignment):
            codes.append(_import_code(name, assignment.node))
        else:
            return GlobalName(name, None)
    return GlobalName(name, "\n".join(dict.fromkeys(c for c in codes if c)))


def _assignment_key(assignment: BaseAssignment) -> str:
    node = getattr(assignment, "node", None)
    return _node_key(node) if isinstance(node, cst.CSTNode) else assignment.name


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
