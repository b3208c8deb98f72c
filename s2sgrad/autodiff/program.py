"""Forward statements as versioned bindings, the shape reverse mode walks.

Takes a differentiator's forward statements; returns a tree of steps (assignments,
branches, opaque statements) where every binding creates a `Version` of its name, each
step knows the versions live before it, and each version knows its abstract value and
whether the name still holds it when forward ends. A name bound in a branch gets a merge
version after the `if`; the branch records which version each side contributes, so a
gradient flowing into the merge reaches whichever branch ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst

from s2sgrad.cst import bound, bound_target, statements
from s2sgrad.frontend.model import Differentiator
from s2sgrad.values import (
    AUG_TO_BINARY,
    BOTTOM,
    OBJECT,
    Evaluator,
    ModuleFacts,
    Value,
    param_value,
    writes,
)
from s2sgrad.values import top as unknown


@dataclass(eq=False)
class Version:
    name: str
    id: int
    value: Value
    #: Index of the top-level statement that created it; -1 for parameters.
    top: int
    in_branch: bool
    is_param: bool = False
    #: The name still holds this version when forward ends.
    final: bool = False
    #: The statement right after which the name holds this version, as a node of
    #: forward's source: a small statement (`t = x * y` of `t = x * y; u = t.exp()`),
    #: a compound one (a loop, or the `if` a merge version comes from); None for
    #: parameters. Snapshots and hoisted sub-expressions are placed by it.
    after: cst.CSTNode | None = None


@dataclass(eq=False)
class Assign:
    target: Version
    value: cst.BaseExpression
    statement: cst.CSTNode
    before: dict[str, Version]
    line: int
    #: Whether the binding is an augmented assignment (`t += x`).
    augmented: bool = False


@dataclass(eq=False)
class Branch:
    test: cst.BaseExpression
    body: list[Step]
    orelse: list[Step]
    before: dict[str, Version]
    line: int
    #: (merge version, version from the body, version from the else side).
    merges: list[tuple[Version, Version | None, Version | None]] = field(
        default_factory=list
    )
    #: Index of the top-level statement it belongs to, and whether it sits inside a
    #: branch of another `if` (an `elif` does).
    top: int = -1
    in_branch: bool = False


@dataclass(eq=False)
class Opaque:
    """A statement reverse mode cannot see into (loops, `with`, unpacking a call)."""

    created: list[Version]
    line: int
    reason: str


Step = Assign | Branch | Opaque


@dataclass
class Program:
    steps: list[Step]
    versions: list[Version]
    params: dict[str, Version]
    final: dict[str, Version]
    #: For each merge version (by id): the versions created inside a branch it merges.
    sides: dict[int, list[Version]] = field(default_factory=dict)
    #: Merge versions of names that some path through the branch leaves unbound.
    partial: set[int] = field(default_factory=set)
    #: For each merge version (by id): the version from before the `if` that a side
    #: which does not rebind the name hands on, the very object.
    kept: dict[int, Version] = field(default_factory=dict)
    #: How many versions reverse mode has added (ids after the program's own).
    added: int = 0

    def fresh_id(self) -> int:
        """Return an id no version has, for versions reverse mode adds (hoisting)."""
        self.added += 1
        return len(self.versions) + self.added - 1

    def at_end(self) -> set[int]:
        """Versions a backward block can read by name: the name holds them when forward
        ends, on every path that reaches the block reading them."""
        return self._sides_of(
            v.id for v in self.final.values() if v.id not in self.partial
        )

    def at_end_where_bound(self) -> set[int]:
        """Versions the name holds when forward ends, on the paths that bind it: those
        of `at_end`, and those of a name that some path leaves unbound (`mask`, bound
        under `if causal:` only). Backward reads the latter under the same test, once
        forward binds the name to None on the other paths."""
        return self._sides_of(v.id for v in self.final.values())

    def may_end_as(self) -> set[int]:
        """Versions whose object the name may hold when forward ends, on some path:
        those of `at_end_where_bound`, and any a merge among them hands on from
        before its `if` (`h` before `if c: h = h * 2`, where `c` is False). A snapshot
        of one is then the very tensor of another output."""
        found = self.at_end_where_bound()
        todo = list(found)
        while todo:
            current = todo.pop()
            for version in [*self.sides.get(current, []), self.kept.get(current)]:
                if version is not None and version.id not in found:
                    found.add(version.id)
                    todo.append(version.id)
        return found

    def _sides_of(self, finals: Iterable[int]) -> set[int]:
        """`finals`, and every version a merge among them takes from a branch."""
        found = set(finals)
        todo = list(found)
        while todo:
            for side in self.sides.get(todo.pop(), []):
                if side.id not in found:
                    found.add(side.id)
                    todo.append(side.id)
        return found


class _Builder:
    def __init__(
        self,
        diff: Differentiator,
        lines: Mapping[cst.CSTNode, int],
        facts: ModuleFacts,
    ) -> None:
        self.diff = diff
        self.lines = lines
        self.facts = facts
        self.siblings = facts.siblings
        self.versions: list[Version] = []
        self.sides: dict[int, list[Version]] = {}
        self.partial: set[int] = set()
        self.kept: dict[int, Version] = {}

    def new(self, name: str, value: Value, top: int, in_branch: bool) -> Version:
        version = Version(name, len(self.versions), value, top, in_branch)
        self.versions.append(version)
        return version

    def after(self, node: cst.CSTNode, env: Mapping[str, Version]) -> dict[str, Value]:
        """The values of names after a statement reverse mode cannot see into."""
        values = {name: v.value for name, v in env.items()}
        evaluator = Evaluator(self.diff.qualified_names, values, self.facts)
        if isinstance(node, cst.BaseStatement):
            evaluator.statement(node)
        elif isinstance(node, cst.BaseSmallStatement):
            evaluator.small(node)
        return evaluator.env

    def value(self, node: cst.BaseExpression, env: Mapping[str, Version]) -> Value:
        values = {name: v.value for name, v in env.items()}
        return Evaluator(self.diff.qualified_names, values, self.facts).expr(node)

    def block(
        self,
        statements: Sequence[cst.BaseStatement],
        env: dict[str, Version],
        top: int | None,
    ) -> list[Step]:
        steps: list[Step] = []
        for i, statement in enumerate(statements):
            index = i if top is None else top
            steps += self.statement(statement, env, index, top is not None)
        return steps

    def statement(
        self,
        node: cst.BaseStatement,
        env: dict[str, Version],
        top: int,
        in_branch: bool,
    ) -> list[Step]:
        line = self.lines.get(node, 0)
        if isinstance(node, cst.SimpleStatementLine):
            steps: list[Step] = []
            for small in node.body:
                start = len(self.versions)
                steps += self.small(small, node, env, top, in_branch, line)
                for version in self.versions[start:]:
                    version.after = small
            return steps
        if isinstance(node, cst.If):
            return [self.branch(node, env, top, in_branch, line)]
        after = self.after(node, env)
        created = [
            self.new(n, after.get(n, unknown(True)), top, in_branch)
            for n in sorted(writes(node) & (set(env) | bound(node)))
        ]
        for version in created:
            version.after = node
        env.update({v.name: v for v in created})
        kind = type(node).__name__
        return [Opaque(created, line, f"a `{kind}` statement")]

    def branch(
        self,
        node: cst.If,
        env: dict[str, Version],
        top: int,
        in_branch: bool,
        line: int,
    ) -> Branch:
        """The steps of an `if`; its merge versions are inside a branch where the `if`
        itself is (a nested `if`), and the name holds them right after the `if`."""
        before = dict(env)
        body_env = dict(env)
        body = self.block(statements(node.body), body_env, top)
        else_env = dict(env)
        orelse: list[Step] = []
        if isinstance(node.orelse, cst.If):
            orelse = [self.branch(node.orelse, else_env, top, True, line)]
        elif isinstance(node.orelse, cst.Else):
            orelse = self.block(statements(node.orelse.body), else_env, top)
        merges = []
        for name in sorted(set(body_env) | set(else_env)):
            a, b = body_env.get(name), else_env.get(name)
            if a is b and a is not None:
                env[name] = a
                continue
            # A side that leaves the name unbound adds no value: a read of the name
            # after the `if` runs only where it is bound (as `values.py` joins them).
            value = (a.value if a else BOTTOM).join(b.value if b else BOTTOM)
            merged = self.new(name, value, top, in_branch)
            merged.after = node
            merges.append((merged, a, b))
            if a is None or b is None:
                self.partial.add(merged.id)
            for side in (a, b):
                if side is not None and side is not before.get(name):
                    self.sides.setdefault(merged.id, []).append(side)
                elif side is not None:
                    self.kept[merged.id] = side
            env[name] = merged
        return Branch(node.test, body, orelse, before, line, merges, top, in_branch)

    def small(
        self,
        node: cst.BaseSmallStatement,
        statement: cst.CSTNode,
        env: dict[str, Version],
        top: int,
        in_branch: bool,
        line: int,
    ) -> list[Step]:
        before = dict(env)
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            return self.assign(
                node.targets[0].target,
                node.value,
                statement,
                before,
                env,
                top,
                in_branch,
                line,
            )
        if isinstance(node, cst.AnnAssign) and node.value is not None:
            return self.assign(
                node.target, node.value, statement, before, env, top, in_branch, line
            )
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
            op = AUG_TO_BINARY.get(type(node.operator))
            if op is not None:
                value = cst.BinaryOperation(node.target, op(), node.value)
                version = self.new(
                    node.target.value, self.value(value, before), top, in_branch
                )
                env[node.target.value] = version
                return [Assign(version, value, statement, before, line, augmented=True)]
        names = sorted(writes(node) & (set(env) | bound(node)))
        if not names:
            return []
        after = self.after(node, env)
        created = [
            self.new(n, after.get(n, unknown(True)), top, in_branch) for n in names
        ]
        env.update({v.name: v for v in created})
        return [Opaque(created, line, "a statement with no derivative rule")]

    def _sibling_result(
        self, target: cst.BaseExpression, value: cst.BaseExpression
    ) -> tuple[cst.Name, cst.BaseExpression] | None:
        """Match `y, _ = g(...)` where `g` is another differentiator of the module."""
        if not (
            isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == 2
        ):
            return None
        first, second = (e.value for e in target.elements)
        func = value.func if isinstance(value, cst.Call) else None
        if (
            isinstance(func, cst.Name)
            and isinstance(first, cst.Name)
            and func.value in self.siblings
        ):
            return first, second
        return None

    def assign(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression,
        statement: cst.CSTNode,
        before: dict[str, Version],
        env: dict[str, Version],
        top: int,
        in_branch: bool,
        line: int,
    ) -> list[Step]:
        if isinstance(target, cst.Name):
            version = self.new(target.value, self.value(value, before), top, in_branch)
            env[target.value] = version
            return [Assign(version, value, statement, before, line)]
        sibling = self._sibling_result(target, value)
        if sibling is not None:
            result, rest = sibling
            found = self.assign(
                result, first_of(value), statement, before, env, top, in_branch, line
            )
            if isinstance(rest, cst.Name):
                env[rest.value] = self.new(rest.value, OBJECT, top, in_branch)
            return found
        if (
            isinstance(target, (cst.Tuple, cst.List))
            and isinstance(value, (cst.Tuple, cst.List))
            and len(target.elements) == len(value.elements)
            and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            steps: list[Step] = []
            for t, v in zip(target.elements, value.elements, strict=True):
                assert isinstance(t.value, cst.Name)
                version = self.new(
                    t.value.value, self.value(v.value, before), top, in_branch
                )
                env[t.value.value] = version
                steps.append(Assign(version, v.value, statement, before, line))
            return steps
        evaluator = Evaluator(
            self.diff.qualified_names,
            {name: v.value for name, v in before.items()},
            self.facts,
        )
        evaluator.bind(target, evaluator.expr(value), value)
        # `cache["t"] = v` changes `cache`: a new version, which reverse mode does not
        # follow (a later `t = cache["t"]` read the dict as it was, without `v`).
        base = target
        while isinstance(base, (cst.Subscript, cst.Attribute)):
            base = base.value
        stored = {base.value} & set(before) if isinstance(base, cst.Name) else set()
        created = [
            self.new(n, evaluator.env.get(n, unknown(True)), top, in_branch)
            for n in sorted(bound_target(target) | stored)
        ]
        env.update({v.name: v for v in created})
        what = (
            "an item or attribute store"
            if stored
            else "unpacking a value that is not a tuple literal"
        )
        return [Opaque(created, line, what)]


def first_of(call: cst.BaseExpression) -> cst.Subscript:
    """Return `call[0]`: the result part of a differentiator's `(result, backward)`."""
    index = cst.SubscriptElement(cst.Index(cst.Integer("0")))
    return cst.Subscript(call, [index])


def build(
    diff: Differentiator,
    lines: Mapping[cst.CSTNode, int],
    facts: ModuleFacts | None = None,
) -> Program:
    """Build the versioned program of `diff`'s forward statements."""
    builder = _Builder(diff, lines, facts or ModuleFacts())
    env: dict[str, Version] = {}
    params: dict[str, Version] = {}
    for param in diff.params:
        version = builder.new(param.name, param_value(param), -1, False)
        version.is_param = True
        env[param.name] = params[param.name] = version
    steps = builder.block(diff.statements, env, None)
    for version in env.values():
        version.final = True
    return Program(
        steps,
        builder.versions,
        params,
        dict(env),
        builder.sides,
        builder.partial,
        builder.kept,
    )
