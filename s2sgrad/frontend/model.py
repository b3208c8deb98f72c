"""Records the frontend hands to the rest of the pipeline.

Everything the later stages need from libcst's metadata (positions, qualified names,
scopes) is resolved here and stored in these frozen records, so no later stage needs a
`MetadataWrapper`. Nodes stored here are the parsed nodes of the source module; later
stages may look them up by identity (libcst nodes hash by identity).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

#: How backward may read a captured tensor without keeping it alive, mapped to the
#: metadata value that is saved instead (`x.size(d)` reads `x.shape[d]`).
METADATA_ATTRIBUTES = {
    "shape": "shape",
    "ndim": "dim",
    "dtype": "dtype",
    "device": "device",
}
METADATA_METHODS = {"size": "shape", "dim": "dim", "numel": "numel"}


@dataclass(frozen=True)
class Param:
    """One forward parameter, as written."""

    name: str
    node: cst.Param
    keyword_only: bool
    annotation: str | None
    #: False when every return of backward gives a literal `None` in this slot.
    gets_gradient: bool


@dataclass(frozen=True)
class Use:
    """One read of a captured name inside backward."""

    name: cst.Name
    #: The metadata kind read (`shape`, `dim`, `dtype`, `device`, `numel`) or None
    #: when the value itself is read.
    metadata: str | None
    #: The whole expression that reads the metadata (`x.shape`, `x.size(0)`).
    expression: cst.BaseExpression
    #: For `x.size(d)`: the `d` expression, read as `x_shape[d]`.
    index: cst.BaseExpression | None
    line: int
    column: int


@dataclass(frozen=True)
class InPlace:
    """An in-place write in forward to a value forward created (not an input).

    Whether it is accepted (the value carries no gradient), rewritten out of place or
    rejected depends on the value, which lifting knows; the frontend records where.
    """

    #: The variable whose value changes, and the node to point at.
    name: str
    node: cst.CSTNode
    #: method (`t.add_(...)`), function (`torch.relu_(t)`), inplace (`inplace=True`),
    #: out (`out=t`), store (`t[0] = 0`, `t[0] += 1`, `t.data = ...`) or helper
    #: (`_bump(t)`, a module function that changes its parameter in place).
    kind: str
    #: The code that writes, as written: `t.add_`, `torch.relu_`, `t[0] = ...`.
    code: str
    line: int
    column: int
    #: How many subscripts, attributes and views the write goes through to `name`:
    #: 0 for `t.add_()`, 1 for `t[0] = 0` and `keep[0].mul_()`.
    depth: int = 0


@dataclass(frozen=True)
class Capture:
    """A free variable of backward that resolves to the forward's scope."""

    name: str
    uses: tuple[Use, ...]

    @property
    def metadata_only(self) -> bool:
        return all(use.metadata is not None for use in self.uses)


@dataclass(frozen=True)
class GlobalName:
    """A module-level name that a differentiator uses, and how to provide it."""

    name: str
    #: The import statement that binds exactly this name (`import torch`,
    #: `from math import sqrt`), or None for a name defined in the module itself.
    import_code: str | None


@dataclass(frozen=True)
class Differentiator:
    """One closure-style differentiator, checked against the input language."""

    name: str
    forward: cst.FunctionDef
    params: tuple[Param, ...]
    #: Forward statements in order, without the docstring, backward and final return.
    statements: tuple[cst.BaseStatement, ...]
    backward: cst.FunctionDef
    grad_params: tuple[str, ...]
    #: The RESULT of `return RESULT, backward`, as written.
    result: cst.BaseExpression
    outputs: tuple[cst.BaseExpression, ...]
    tuple_result: bool
    captures: tuple[Capture, ...]
    docstring: str | None
    first_line: int
    last_line: int
    backward_line: int
    #: Whether some return of backward is a bare `None` (no gradient for anything).
    returns_bare_none: bool
    #: Whether every return of backward lists its gradients in a tuple display (or is a
    #: bare `None`); otherwise one may hand back a list or a name bound at run time.
    returns_tuples: bool
    #: Global names used anywhere in the function, its signature included.
    globals_used: tuple[str, ...]
    #: Every name bound or read in the function (for collision-free generated names).
    local_names: frozenset[str]
    #: Qualified names of the Name/Attribute nodes in forward that have one.
    qualified_names: Mapping[cst.CSTNode, str]
    #: Line of each statement inside forward (for comments that point at the source).
    statement_lines: Mapping[cst.CSTNode, int]
    #: `# s2sgrad: key=value` pragmas on the def line or in the body.
    pragmas: Mapping[str, str]
    #: In-place writes in forward to values forward created.
    writes: tuple[InPlace, ...] = ()
    #: The module helpers that may return an argument they are given, or a container
    #: holding one (`return t`, `return [t]`): what they return may share its tensor.
    handing_back: frozenset[str] = frozenset()
    #: Names bound in backward and used nowhere else: each one's Name nodes (lifting
    #: renames one that a generated keyword parameter needs).
    backward_locals: Mapping[str, tuple[cst.Name, ...]] = dataclasses.field(
        default_factory=dict
    )
    #: Whether backward's in-place ops were written out of place (`inplace.py`).
    backward_rewritten: bool = False


@dataclass(frozen=True)
class Helper:
    """A module-level function that differentiators call: what it returns is read
    from its body when a differentiator's values are inferred."""

    name: str
    node: cst.FunctionDef
    #: Qualified names of the Name/Attribute nodes inside it that have one.
    qualified_names: Mapping[cst.CSTNode, str]


@dataclass(frozen=True)
class ParsedModule:
    """A source module and the differentiators found in it."""

    path: str
    source: str
    #: `source` split into lines as Python numbers them (`s2sgrad.lines`), once.
    lines: tuple[str, ...]
    module: cst.Module
    differentiators: tuple[Differentiator, ...]
    globals: Mapping[str, GlobalName]
    #: Every name bound at module level.
    module_names: frozenset[str]
    #: The plain module-level functions the differentiators call, by name.
    helpers: Mapping[str, Helper] = dataclasses.field(default_factory=dict)
    #: Module-level names bound once, by a plain assignment: their values.
    constants: Mapping[str, cst.BaseExpression] = dataclasses.field(
        default_factory=dict
    )
