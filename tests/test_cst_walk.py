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

from s2sgrad.cst import findall, nodes, remembering, walk
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
    "matcher",
    [
        m.Call(),
        m.Name("x") | m.Attribute(),
        m.Assign(targets=[m.AssignTarget(m.Name())]),
        m.Call(func=m.Name(m.MatchIfTrue(lambda name: name.startswith("_")))),
        m.Return() | m.Subscript(slice=[m.ZeroOrMore()]),
    ],
)
def test_findall_finds_what_libcst_finds(matcher):
    for path in SOURCES[:12]:
        module = cst.parse_module(path.read_text())
        assert findall(module, matcher) == list(m.findall(module, matcher))
        with remembering():
            assert findall(module, matcher) == list(m.findall(module, matcher))
            assert nodes(module) is nodes(module)  # walked once


def test_findall_refuses_a_matcher_that_is_not_of_nodes():
    with pytest.raises(TypeError):
        findall(cst.parse_module("x = 1\n"), m.MatchIfTrue(bool))  # type: ignore[arg-type]


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
