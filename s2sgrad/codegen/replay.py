"""What `setup_context` can compute again from the Function's inputs.

Takes a differentiated record; returns the context entries that are plain Python values
(numbers, bools, strings, dtypes: no tensor, no container) which forward computes from
its non-tensor parameters, the metadata of its tensor parameters and module constants,
and the forward statements, sliced, that compute them. The Function then does not
return such a value from `forward` as an extra output (torch.compile refuses a Python
float there: "HOP body output unsupported"); `setup_context` runs the slice on
`inputs` instead. Invariant: the slice reads no tensor's data and calls only builtins
and `math`, so running it again costs nothing and gives the same values.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.inline import bound_names
from s2sgrad.autodiff.record import Differentiated
from s2sgrad.cst import (
    binds_one_name,
    findall,
    is_name,
    statements,
)
from s2sgrad.frontend.model import METADATA_ATTRIBUTES, METADATA_METHODS
from s2sgrad.lift import Saved
from s2sgrad.values import SEQ, TENSOR, param_value

#: Attributes and methods of a tensor that give its metadata (`x.shape`, `x.dim()`).
_METADATA = frozenset({*METADATA_ATTRIBUTES, *METADATA_METHODS})


@dataclass(frozen=True)
class Replay:
    """Context entries `setup_context` computes itself, and how."""

    entries: tuple[Saved, ...]
    statements: tuple[cst.BaseStatement, ...]
    #: The parameters the statements read, which `setup_context` unpacks from inputs.
    params: frozenset[str]


def replay(
    record: Differentiated,
    taken: set[str],
    literals: frozenset[str] = frozenset(),
    unpacked: Mapping[str, str] | None = None,
) -> Replay | None:
    """The plain extras `setup_context` can compute from inputs, or None; `taken` are
    the names `setup_context` binds for itself, which the slice must not rebind,
    `literals` the module constants bound to a literal, which it may read, and
    `unpacked` the name each parameter gets there (the slice reads a parameter only
    where it keeps its own name)."""
    values = record.lifted.values
    wanted = [
        s
        for s in record.extras
        if not s.promoted
        and s.kind != "metadata"
        and s.name == s.source
        and s.source in values
        and not values[s.source].kinds & {TENSOR, SEQ}
    ]
    if not wanted:
        return None
    statements = _slice(list(record.forward_statements), {s.source for s in wanted})
    if not statements:
        return None
    params = {p.name: p for p in record.source.params}
    free = _free_reads(statements) - set(dir(builtins)) - {"math"} - literals
    bound = bound_names(statements)
    if bound & (taken | set(params)):
        return None
    for name in bound:  # every value the slice computes is plain too
        value = values.get(name)
        if value is None or value.kinds & {TENSOR, SEQ}:
            return None
    for name in free:
        param = params.get(name)
        if param is None:
            return None  # a temporary, or a module-level name of unknown kind
        if unpacked is not None and unpacked.get(name) != name:
            return None  # setup_context takes it under another name
        value = param_value(param)
        if value.tensor_list:
            return None
        if TENSOR in value.kinds and not _metadata_only(statements, name):
            return None
    if not _calls_builtins_only(statements, free):
        return None
    return Replay(tuple(wanted), tuple(statements), frozenset(free))


def _slice(
    statements: Sequence[cst.BaseStatement], wanted: set[str]
) -> list[cst.BaseStatement] | None:
    """The statements that compute `wanted`, branches sliced too; None where one that
    binds a wanted name is a loop, a `with`, a `try` or not a plain assignment."""
    needed = set(wanted)
    kept: list[cst.BaseStatement] = []
    for statement in reversed(statements):
        bound = bound_names([statement])
        if not bound & needed:
            if _reads(statement) & needed and (
                not binds_one_name(statement) or _calls_a_method_of(statement, needed)
            ):
                return None  # it may change a value the slice reads (`xs.append`)
            continue
        if isinstance(statement, cst.If):
            sliced = _slice_if(statement, needed)
            if sliced is None:
                return None
            kept.append(sliced)
            needed |= _reads(sliced)
        elif binds_one_name(statement):
            kept.append(statement)
            needed -= bound
            needed |= _reads(statement)
        else:
            return None
    return kept[::-1]


def _slice_if(statement: cst.If, needed: set[str]) -> cst.If | None:
    body = _slice(statements(statement.body), needed)
    orelse = statement.orelse
    other: list[cst.BaseStatement] | None = []
    if isinstance(orelse, cst.Else):
        other = _slice(statements(orelse.body), needed)
    elif isinstance(orelse, cst.If):
        nested = _slice_if(orelse, needed)
        other = None if nested is None else [nested]
    if body is None or other is None:
        return None
    block = cst.IndentedBlock(body or [cst.SimpleStatementLine([cst.Pass()])])
    new_else = cst.Else(cst.IndentedBlock(other)) if other else None
    return statement.with_changes(body=block, orelse=new_else)


def _calls_a_method_of(statement: cst.BaseStatement, names: set[str]) -> bool:
    """Whether `statement` calls a method of one of `names` (which may change it)."""
    return any(
        isinstance(call.func, cst.Attribute)
        and isinstance(call.func.value, cst.Name)
        and call.func.value.value in names
        for call in findall(statement, cst.Call)
    )


def _reads(node: cst.CSTNode) -> set[str]:
    return {n.value for n in findall(node, cst.Name)}


def _free_reads(statements: Sequence[cst.BaseStatement]) -> set[str]:
    """The names the slice reads that it does not bind first (attributes aside)."""
    found: set[str] = set()
    bound: set[str] = set()

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            if node.value not in bound:
                found.add(node.value)

        def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
            return False

    for statement in statements:
        statement.visit(_Reads())
        bound |= bound_names([statement])
    return found


def _metadata_only(statements: Sequence[cst.BaseStatement], name: str) -> bool:
    """Whether every read of tensor `name` takes its metadata (`x.shape`, `x.dim()`)."""
    uses = [
        n for s in statements for n in findall(s, cst.Name, lambda n: n.value == name)
    ]
    metadata = [
        a
        for s in statements
        for a in findall(
            s,
            cst.Attribute,
            lambda a: is_name(a.value, name) and a.attr.value in _METADATA,
        )
    ]
    return len(uses) == len(metadata)


def _calls_builtins_only(
    statements: Sequence[cst.BaseStatement], params: set[str]
) -> bool:
    """Whether every call is a builtin's, `math`'s or a metadata method of a parameter
    (nothing that could draw random numbers, allocate or take a while)."""
    for statement in statements:
        for call in findall(statement, cst.Call):
            func = call.func
            if isinstance(func, cst.Name) and hasattr(builtins, func.value):
                continue
            if isinstance(func, cst.Attribute) and is_name(func.value, "math"):
                continue
            if (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Name)
                and func.value.value in params
                and func.attr.value in METADATA_METHODS
            ):
                continue
            return False
    return True
