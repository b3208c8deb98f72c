"""Reading trees without rebuilding them gives what libcst gives (issue 23, point 4).

`s2sgrad.cst.walk`, `nodes` and `findall` replace libcst's `visit` and
`matchers.findall` for reading, and `frontend.metadata.Metadata` replaces
`MetadataWrapper` for resolving; everything downstream relies on the same callbacks
in the same order and the same metadata. Checked on s2sgrad's own sources, the
corpus and the samples: they hold most of Python's syntax, f-strings with format
specs, decorators, classes and comprehensions among it.
"""

from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.metadata import (
    MetadataWrapper,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from s2sgrad.cst import (
    assigned_name,
    calls_name,
    findall,
    is_name,
    nodes,
    remembering,
    sole,
    sole_target,
    walk,
)
from s2sgrad.frontend.metadata import Metadata

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    [
        *(ROOT / "s2sgrad").rglob("*.py"),
        *(ROOT / "tests" / "corpus").glob("*.py"),
        *(ROOT / "samples").glob("*.py"),
    ]
)
SOURCES = [p for p in SOURCES if p.name != "table.py"]  # 3,800 lines of data


class _Log(cst.CSTVisitor):
    """Every callback, with attribute callbacks: what a visitor can observe."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.log.append(("visit", id(node), ""))
        return not isinstance(node, cst.Lambda)  # pruning is honoured too

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.log.append(("leave", id(original_node), ""))

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.log.append(("enter", id(node), attribute))

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        self.log.append(("exit", id(original_node), attribute))


class _Names(cst.CSTVisitor):
    """A visitor with libcst's own dispatch (`visit_<Node>` methods only)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.seen.append(id(node))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.seen.append(id(node))
        return node.name.value != "backward"

    def leave_Call(self, original_node: cst.Call) -> None:
        self.seen.append(id(original_node))


@pytest.mark.parametrize(
    "path", SOURCES[::2], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_walk_and_nodes_follow_libcst_visit(path):
    module = cst.parse_module(path.read_text())
    for visitor in (_Log, _Names):
        expected, got = visitor(), visitor()
        module.visit(expected)
        walk(module, got)
        assert vars(got) == vars(expected)
    order = _Order()
    module.visit(order)
    assert [id(n) for n in nodes(module)] == order.seen


class _Order(cst.CSTVisitor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.seen.append(id(node))
        return True


@pytest.mark.parametrize(
    ("kinds", "where", "matcher"),
    [
        (cst.Call, None, m.Call()),
        (
            (cst.Name, cst.Attribute),
            lambda n: not isinstance(n, cst.Name) or n.value == "x",
            m.Name("x") | m.Attribute(),
        ),
        (cst.Assign, assigned_name, m.Assign(targets=[m.AssignTarget(m.Name())])),
        (
            cst.Call,
            lambda n: calls_name(n) and n.func.value.startswith("_"),
            m.Call(func=m.Name(m.MatchIfTrue(lambda name: name.startswith("_")))),
        ),
        (
            (cst.Return, cst.Subscript),
            None,
            m.Return() | m.Subscript(slice=[m.ZeroOrMore()]),
        ),
        # A base class, whose subclasses are found by `isinstance`.
        (
            cst.BaseSmallStatement,
            None,
            m.MatchIfTrue(lambda n: isinstance(n, cst.BaseSmallStatement)),
        ),
    ],
)
def test_findall_finds_what_libcst_finds(kinds, where, matcher):
    for path in SOURCES[:12]:
        module = cst.parse_module(path.read_text())
        assert findall(module, kinds, where) == list(m.findall(module, matcher))
        with remembering():
            assert findall(module, kinds, where) == list(m.findall(module, matcher))
            assert nodes(module) is nodes(module)  # walked once


@pytest.mark.parametrize(
    ("source", "shapes"),
    [
        # (sole(line, Return), sole_target, assigned_name, is_name "t", calls_name)
        ("return t\n", (True, False, False, True, False)),
        ("t = f(x)\n", (False, True, True, False, True)),
        ("a, b = x\n", (False, True, False, False, False)),
        ("a = b = x\n", (False, False, False, False, False)),
        ("return t; x = 1\n", (False, False, False, True, False)),
    ],
)
def test_statement_shapes_as_the_matchers_say(source, shapes):
    line = cst.parse_module(source).body[0]
    small = line.body[0]
    value = getattr(small, "value", None)
    found = (
        sole(line, cst.Return) is not None,
        sole_target(small) is not None,
        assigned_name(small) is not None,
        is_name(value, "t"),
        calls_name(value),
    )
    expected = (
        m.matches(line, m.SimpleStatementLine(body=[m.Return()])),
        m.matches(small, m.Assign(targets=[m.AssignTarget()])),
        m.matches(small, m.Assign(targets=[m.AssignTarget(m.Name())])),
        value is not None and m.matches(value, m.Name("t")),
        value is not None and m.matches(value, m.Call(func=m.Name())),
    )
    assert found == expected == shapes


@pytest.mark.parametrize("path", SOURCES[::6], ids=lambda p: p.name)
def test_metadata_resolves_what_libcst_resolves(path):
    module = cst.parse_module(path.read_text())
    providers = [ScopeProvider, QualifiedNameProvider, PositionProvider]
    ours = Metadata(module, unsafe_skip_copy=True).resolve_many(providers)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve_many(providers)
    assert ours[PositionProvider] == theirs[PositionProvider]
    scopes, their_scopes = ours[ScopeProvider], theirs[ScopeProvider]
    assert list(scopes) == list(their_scopes)
    for node, scope in scopes.items():
        other = their_scopes[node]
        assert type(scope) is type(other)
        if isinstance(node, (cst.Name, cst.Attribute)) and scope is not None:
            assert scope.get_qualified_names_for(node) == (
                other.get_qualified_names_for(node)
            )
