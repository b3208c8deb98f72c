"""Decide, per captured temporary, how its gradient gets back: generated VJP or recompute.

Takes a `Lifted` record, the options and the source text; returns a `Differentiated`
record (autodiff/record.py): lift's record, the context completed (entries the VJP code
reads, promotion flags), forward statements with any snapshots the VJP needs, and a
`Gradients` record for codegen. Under the `first-order` policy, or with no temporaries,
the context and bodies are lift's.
Invariant: every temporary backward reads is either promoted (its gradient flows back
through generated code) or recomputed inside backward from saved inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.autodiff.forward import ForwardLines, with_lines
from s2sgrad.autodiff.program import Program, Version, build
from s2sgrad.autodiff.record import Differentiated, Gradients, Recompute
from s2sgrad.autodiff.registry import builtin_registry
from s2sgrad.autodiff.shapes import shape_facts
from s2sgrad.autodiff.simplify import simplify
from s2sgrad.autodiff.vjp import (
    ACCUMULATE,
    Generator,
    NoRule,
    Sibling,
    placeholder_version,
    slice_of,
)
from s2sgrad.cst import (
    as_statement,
    bound,
    code,
    dotted,
    findall,
    spelled,
    walk,
)
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.compose import draws, draws_here
from s2sgrad.frontend.model import (
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    Differentiator,
    ParsedModule,
)
from s2sgrad.lift import (
    METADATA_CODE,
    Lifted,
    Saved,
    classify,
    in_context_order,
    origin,
    rebound_names,
)
from s2sgrad.names import NameAllocator, Names
from s2sgrad.options import Options
from s2sgrad.values import (
    NONE,
    UNKNOWN,
    Evaluator,
    ModuleFacts,
    Value,
    result_value,
    writes,
)


class _Reads(cst.CSTVisitor):
    """Collect placeholder reads in order: (version id, metadata kind or None)."""

    def __init__(self) -> None:
        self.reads: list[tuple[int, str | None]] = []
        self.handled: set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in METADATA_METHODS:
            version = placeholder_version(func.value)
            limit = 1 if func.attr.value == "size" else 0
            if version is not None and len(node.args) <= limit:
                self.handled |= {id(func), id(func.value)}
                self.reads.append((version, METADATA_METHODS[func.attr.value]))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        version = placeholder_version(node.value)
        if version is not None and id(node) not in self.handled:
            if node.attr.value in METADATA_ATTRIBUTES:
                self.handled.add(id(node.value))
                self.reads.append((version, METADATA_ATTRIBUTES[node.attr.value]))

    def visit_Name(self, node: cst.Name) -> None:
        version = placeholder_version(node)
        if version is not None and id(node) not in self.handled:
            self.reads.append((version, None))


class _Resolve(cst.CSTTransformer):
    """Replace placeholder reads with the names backward reads them by."""

    def __init__(
        self, values: dict[int, str], metadata: dict[tuple[int, str], str]
    ) -> None:
        self.values = values
        self.meta_names = metadata

    def _meta(self, node: cst.BaseExpression, kind: str) -> str | None:
        version = placeholder_version(node)
        return None if version is None else self.meta_names.get((version, kind))

    def leave_Call(
        self, original_node: cst.Call, updated_node: cst.Call
    ) -> cst.BaseExpression:
        func = original_node.func
        if isinstance(func, cst.Attribute) and func.attr.value in METADATA_METHODS:
            name = self._meta(func.value, METADATA_METHODS[func.attr.value])
            if name is not None and original_node.args:
                index = original_node.args[0].value
                return cst.Subscript(
                    _read(name), [cst.SubscriptElement(cst.Index(index))]
                )
            if name is not None:
                return _read(name)
        return updated_node

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if original_node.attr.value in METADATA_ATTRIBUTES:
            name = self._meta(
                original_node.value, METADATA_ATTRIBUTES[original_node.attr.value]
            )
            if name is not None:
                return _read(name)
        return updated_node

    def leave_Name(
        self, original_node: cst.Name, updated_node: cst.Name
    ) -> cst.BaseExpression:
        version = placeholder_version(original_node)
        if version is None or version not in self.values:
            return updated_node  # a metadata read: the enclosing node is replaced
        return cst.Name(self.values[version])


@dataclass
class _Attempt:
    generator: Generator
    needed: set[int]
    blocks: list[cst.BaseStatement]


@dataclass
class _Context:
    """The context under construction: entries, and which version each reads."""

    entries: list[Saved]
    versions: dict[str, int] = field(default_factory=dict)
    #: What forward binds for backward besides the context: snapshots, None defaults.
    lines: ForwardLines = field(default_factory=ForwardLines)


class _Swap(cst.CSTTransformer):
    """Replace names read by expressions."""

    def __init__(self, swaps: Mapping[str, cst.BaseExpression]) -> None:
        self.swaps = swaps

    def leave_Name(
        self, original_node: cst.Name, updated_node: cst.Name
    ) -> cst.BaseExpression:
        return self.swaps.get(updated_node.value, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        return updated_node.with_changes(attr=original_node.attr)  # `o.x` is no read

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)


class Planner:
    """Plan gradients for one lifted differentiator."""

    def __init__(
        self,
        lifted: Lifted,
        options: Options,
        lines: Sequence[str],
        siblings: Mapping[str, Sibling] | None = None,
        facts: ModuleFacts | None = None,
        path: str = "<source>",
    ) -> None:
        self.path = path
        self.siblings = siblings or {}
        self.facts = facts or ModuleFacts()
        self.lifted = lifted
        self.diff = lifted.source
        self.policy = self.diff.pragmas.get("policy", options.policy)
        self.line_length = options.line_length
        self.source = lines
        self.program: Program = build(self.diff, self.diff.statement_lines, self.facts)
        self.shapes = shape_facts(self.program, self.diff.qualified_names)
        self.at_end = self.program.at_end()
        self.where_bound = self.program.at_end_where_bound()
        self.may_end_as = self.program.may_end_as()
        self.by_id = {v.id: v for v in self.program.versions}
        self.backward_locals = _backward_locals(self.diff, self.lifted.backward_body)
        self.rebound = rebound_names(self.diff)

    def plan(self) -> Differentiated:
        temps = [s for s in self.lifted.context if s.kind == "temporary"]
        if self.policy == "first-order" or not temps:
            record = Differentiated.as_lifted(self.lifted)
            lines = ForwardLines()
            self._bind_everywhere(record.context, lines)
            if not lines.defaults:
                return record
            forward = with_lines(self.diff.statements, lines, self.program)
            return replace(record, forward_statements=tuple(forward))
        names = NameAllocator(self.lifted.taken)
        results = list(self.lifted.results)
        attempt = self._all_at_once(temps, names, results)
        if attempt is not None:
            return self._assemble(attempt, [], results, names)
        recompute: list[tuple[Saved, str]] = []
        promote: list[Saved] = []
        for temp in temps:
            reason = self._why_not(temp, names, results)
            if reason is None:
                promote.append(temp)
            else:
                recompute.append((temp, reason))
        attempt = self._attempt(promote, names, results)
        return self._assemble(attempt, recompute, results, names)

    def _all_at_once(
        self, temps: list[Saved], names: NameAllocator, results: list[str]
    ) -> _Attempt | None:
        """Differentiate every temporary in one pass: the common case, and the fast one."""
        if self.policy == "recompute" or not all(t.tensor for t in temps):
            return None
        trial = names.child()
        try:
            attempt = self._attempt(temps, trial, results)
            self._check_reads(attempt)
        except NoRule:
            return None
        names.taken = trial.taken
        return attempt

    def _why_not(
        self, temp: Saved, names: NameAllocator, results: list[str]
    ) -> str | None:
        if self.policy == "recompute":
            return "the recompute policy is set for this function"
        try:
            attempt = self._attempt([temp], names.child(), results)
            self._check_reads(attempt)
        except NoRule as exc:
            return f"line {exc.line}: {exc.reason}" if exc.line else exc.reason
        if not temp.tensor:
            return "it is not known to be a tensor, so it cannot be an extra output"
        return None

    def _attempt(
        self, temps: Sequence[Saved], names: NameAllocator, results: list[str]
    ) -> _Attempt:
        """Differentiate `temps`; where the VJP code reads a version a branch made of
        a name (`t` bound on both sides of an `if`), the name's merged version is
        differentiated too, so that the gradient a higher order sends for what the
        name holds reaches whichever side ran (it reached the first side only)."""
        merged: list[Version] = []
        while True:
            trial = names.child()
            attempt = self._attempt_once(temps, merged, trial, results)
            more = self._merges_read(attempt) - {v.id for v in merged}
            if not more:
                names.taken = trial.taken
                return attempt
            merged += [self.by_id[i] for i in sorted(more)]

    def _merges_read(self, attempt: _Attempt) -> set[int]:
        """The final merged versions one of whose sides the VJP code reads."""
        found: set[int] = set()
        if not self.program.sides or not attempt.blocks:
            return found  # no branch binds a name: nothing to look for
        for version_id, metadata in self._reads(attempt):
            owner = self._owner(self.by_id[version_id])
            if metadata is None and owner.id != version_id and owner.value.diff:
                if owner.id not in attempt.generator.accumulators:
                    found.add(owner.id)
        return found

    def _owner(self, version: Version) -> Version:
        """The version a name holds when forward ends, where `version` is one side
        of it (made in a branch); else `version` itself."""
        final = self.program.final.get(version.name)
        if final is None or final.id == version.id:
            return version
        if version.id in self.program._sides_of([final.id]):
            return final
        return version

    def _attempt_once(
        self,
        temps: Sequence[Saved],
        merged: Sequence[Version],
        names: NameAllocator,
        results: list[str],
    ) -> _Attempt:
        accumulators = {
            self.program.params[p.name].id: results[i]
            for i, p in enumerate(self.diff.params)
            if results[i] != "None"
        }
        for temp in temps:
            accumulators[self.program.final[temp.source].id] = names.fresh(
                f"grad_{temp.name}"
            )
        for version in merged:
            if version.id not in accumulators:
                accumulators[version.id] = names.fresh(f"grad_{version.name}")
        generator = Generator(
            self.diff,
            self.program,
            builtin_registry(),
            names,
            accumulators,
            self.source,
            self.siblings,
            self.facts,
            self.shapes,
            self.line_length,
        )
        if not temps:
            return _Attempt(generator, set(), [])
        needed = slice_of(
            self.program,
            {self.program.final[t.source].id for t in temps} | {v.id for v in merged},
        )
        blocks = generator.run(needed)
        for version in generator.extra + generator.condition_versions:
            self.by_id[version.id] = version
            self.at_end.add(version.id)
        return _Attempt(generator, needed, blocks)

    def _reads(self, attempt: _Attempt) -> list[tuple[int, str | None]]:
        reads = _Reads()
        for block in attempt.blocks:
            walk(block, reads)
        return reads.reads

    def _check_reads(self, attempt: _Attempt) -> None:
        for version_id, metadata in self._reads(attempt):
            version = self.by_id[version_id]
            if metadata is not None and version.id in self.program.partial:
                # Read off None where no branch bound it: no point of forward has
                # the value on every path that reads it.
                assert version.after is not None
                raise NoRule(
                    self.diff.statement_lines.get(version.after, 0),
                    f"the generated VJP would read `{version.name}`'s {metadata} "
                    "after this `if`, which leaves it unbound on some path",
                )
            value = version.value
            if (
                metadata is None
                and value.diff
                and value.tensor is not True
                and not version.is_param
            ):
                raise NoRule(
                    0,
                    f"the generated VJP would read `{version.name}`, which is not "
                    "known to be one tensor, so it cannot be an extra output",
                )

    # -- assembling the result ----------------------------------------------------------
    def _assemble(
        self,
        attempt: _Attempt,
        recompute: list[tuple[Saved, str]],
        results: list[str],
        names: NameAllocator,
    ) -> Differentiated:
        dropped = {t.name for t, _ in recompute}
        ctx = _Context([s for s in self.lifted.context if s.name not in dropped])
        for saved in ctx.entries:
            if saved.kind not in ("metadata",) and saved.source in self.program.final:
                ctx.versions[saved.name] = self.program.final[saved.source].id
        value_names, meta_names = self._resolve(attempt, ctx, names)
        backward_body, swaps = self._metadata_off_saved(ctx)
        blocks = [
            as_statement(b.visit(_Resolve(value_names, meta_names)))
            for b in attempt.blocks
        ]
        if swaps:
            # The VJP code may read the same entry (`x_dtype` for `grad.to(x.dtype)`
            # where the closure reads `x.dtype` too): it reads the tensor's as well.
            blocks = [as_statement(b.visit(_Swap(swaps))) for b in blocks]
        entries = [
            replace(s, promoted=True) if s.kind == "temporary" else s
            for s in ctx.entries
        ]
        incoming_list: list[tuple[str, str]] = []
        for saved in (s for s in entries if s.promoted):
            version = self.by_id[ctx.versions[saved.name]]
            owner = self._owner(version)
            if owner.id in attempt.generator.accumulators:
                version = owner  # the VJP reads one side; the entry holds the merge
            accumulator = attempt.generator.accumulator(version)
            if accumulator in results:
                # A promoted snapshot of a parameter (`a_0 = a` before `a = a * 2`): its
                # gradient is the parameter's, so it is added to the result, under its
                # own name (the result variable starts at None).
                keyword = names.fresh(f"grad_{saved.name}")
                blocks.insert(0, _add_into(accumulator, keyword))
                incoming_list.append((saved.name, keyword))
            else:
                incoming_list.append((saved.name, accumulator))
        incoming = tuple(incoming_list)
        # A hoisted sub-expression's own block runs only where it is promoted.
        unpromoted = attempt.generator.hoist_accumulators - {k for _, k in incoming}
        blocks = [b for b in blocks if not _guarded_by(b, unpromoted)]
        plan = self._recompute(recompute, entries, ctx, names)
        fixed = set(results) | {k for _, k in incoming}
        starting = set(attempt.generator.accumulators.values()) - fixed
        blocks = simplify(blocks, starting, fixed)
        used = spelled(*blocks)
        inits = tuple(sorted(name for name in starting if name in used))
        covered = tuple(
            dict.fromkeys(
                attempt.generator.notes[c.value]
                for c in _comments(blocks)
                if c.value in attempt.generator.notes
            )
        )
        gradients = Gradients(
            incoming, tuple(results), tuple(blocks), inits, plan, covered
        )
        # What the rules read and the simplifier folded away (`x.dim()` for a rank
        # test that a literal settled) does not travel.
        read = spelled(*blocks, backward_body) | set(plan.args if plan else ())
        entries = [s for s in entries if s.promoted or s.name in read]
        # A sub-expression named for its shape alone is not needed once that shape is
        # read off a saved tensor of the same shape.
        kept = (
            used | {s.source for s in ctx.entries} | {s.expression for s in ctx.entries}
        )
        hoists = {
            key: [(name, node) for name, node in lines if name in kept]
            for key, lines in attempt.generator.hoists.items()
        }
        ctx.lines.hoists = hoists
        for version in attempt.generator.condition_versions:
            if version.name in used and version.in_branch:
                ctx.lines.default(version.top, version.name)
        ctx.lines.conditions = {
            key: named
            for key, named in attempt.generator.conditions.items()
            if named[0] in used
        }
        self._bind_everywhere(entries, ctx.lines)
        forward = with_lines(self.diff.statements, ctx.lines, self.program)
        return Differentiated(
            self.lifted,
            context=in_context_order(entries),
            backward_body=backward_body,
            forward_statements=tuple(forward),
            gradients=gradients,
            first_order=False,
            taken=frozenset(names.taken),
        )

    def _bind_everywhere(self, entries: Sequence[Saved], lines: ForwardLines) -> None:
        """Bind to None first the names the context reads at the end of forward that
        some path leaves unbound (`mask`, bound under `if causal:` only): backward
        reads them only where that branch ran, but forward hands over the context on
        every path."""
        for saved in entries:
            final = self.program.final.get(saved.expression)
            if saved.kind != "metadata" and final and final.id in self.program.partial:
                lines.default(final.top, final.name)

    def _metadata_off_saved(
        self, ctx: _Context
    ) -> tuple[cst.BaseSuite, dict[str, cst.BaseExpression]]:
        """The closure's body, with the metadata it reads (`x.shape`, kept as `x_shape`)
        read off the tensor itself where the generated VJP code saves that tensor;
        and those entries' names, each with what now stands for it."""
        held = {
            s.source
            for s in ctx.entries
            if s.storage == "tensor"
            and s.name == s.source
            and ctx.versions.get(s.name) in self.at_end
        }
        swaps: dict[str, cst.BaseExpression] = {}
        for saved in list(ctx.entries):
            if saved.kind == "metadata" and saved.source in held:
                if saved in self.lifted.context:
                    swaps[saved.name] = cst.parse_expression(saved.expression)
                    ctx.entries.remove(saved)
        body = self.lifted.backward_body
        if not swaps:
            return body, swaps
        swapped = body.visit(_Swap(swaps))
        assert isinstance(swapped, cst.BaseSuite)
        return swapped, swaps

    def _resolve(
        self, attempt: _Attempt, ctx: _Context, names: NameAllocator
    ) -> tuple[dict[int, str], dict[tuple[int, str], str]]:
        """Decide how backward reads each forward version the VJP code uses."""
        kinds: dict[int, set[str | None]] = {}
        for version_id, kind in self._reads(attempt):
            kinds.setdefault(version_id, set()).add(kind)
        values: dict[int, str] = {}
        metadata: dict[tuple[int, str], str] = {}
        for version_id, wanted in list(kinds.items()):
            # Shapes of a value in the class of a saved tensor are read off it.
            for kind in sorted(k for k in wanted if k in _SHAPELIKE):
                found = self._same_shape(self.by_id[version_id], ctx, kind, kinds)
                if found is not None:
                    metadata[(version_id, kind)] = found
                    wanted.discard(kind)
            if not wanted:
                del kinds[version_id]
        for version_id, wanted in kinds.items():
            version = self.by_id[version_id]
            later = None
            if version_id not in self.at_end:
                later = self._read_later(version, wanted, ctx, names, metadata)
                if later is None:
                    continue
            source = later or version.name
            if None in wanted:
                values[version_id] = self._value_entry(version, source, ctx, names)
            for kind in sorted(k for k in wanted if k is not None):
                metadata[(version_id, kind)] = self._meta_entry(
                    source, kind, ctx, names
                )
        return values, metadata

    def _read_later(
        self,
        version: Version,
        wanted: set[str | None],
        ctx: _Context,
        names: NameAllocator,
        metadata: dict[tuple[int, str], str],
    ) -> str | None:
        """Make forward keep a version that the name does not hold on every path when
        forward ends; return the name backward reads its value by, or None when it
        reads only metadata (snapshotted into `metadata`).

        The VJP code reads a version only where the statement that made it ran: under
        the same tests, when it comes from a branch. So a version the name holds at
        the end on the paths through that branch is read by name, the name bound to
        None before the `if` for the other paths; any other version is snapshotted
        right after the statement that makes it, inside its branch, the snapshot bound
        to None before the `if`. Metadata of a version from a branch is snapshotted
        there too: read at the end of forward, it would be read off None.
        """
        if version.id in self.program.partial:
            # A merge that some path leaves unbound: bound to None first.
            ctx.lines.default(version.top, version.name)
        by_name = version.id in self.where_bound
        if by_name:
            ctx.lines.default(self.program.final[version.name].top, version.name)
            source = version.name
        else:
            source = names.fresh(f"{version.name}_{_ordinal(self.program, version)}")
        kinds = sorted(k for k in wanted if k is not None)
        if None in wanted and not version.in_branch:
            kinds = []  # read off the snapshot, as any saved tensor's metadata
        for kind in kinds:
            snap = names.fresh(f"{source}_{kind}")
            self._snapshot(version, snap, METADATA_CODE[kind].format(version.name), ctx)
            ctx.entries.append(
                Saved(snap, version.name, "metadata", snap, "object", False, None, 0)
            )
            metadata[(version.id, kind)] = snap
        wanted.difference_update(kinds)
        if None not in wanted:
            return None
        if by_name:
            return version.name
        self._snapshot(version, source, version.name, ctx)
        ctx.lines.aliased.add(version.name)
        return source

    def _snapshot(self, version: Version, name: str, code: str, ctx: _Context) -> None:
        """Bind `name = code` in forward right after `version` is made; to None first
        where that is inside a branch, for the paths that do not run it."""
        ctx.lines.snapshot(version.after, name, code)
        if version.in_branch:
            ctx.lines.default(version.top, name)

    def _same_shape(
        self,
        version: Version,
        ctx: _Context,
        kind: str,
        reads: dict[int, set[str | None]],
    ) -> str | None:
        """`t.shape` of a tensor backward has anyway, with `version`'s shape."""
        wanted = self.shapes.of(version)
        held = [
            (saved.name, self.by_id[ctx.versions[saved.name]])
            for saved in ctx.entries
            if saved.storage == "tensor" and saved.name in ctx.versions
        ]
        held += [  # read by name, which backward may bind to something else
            (self.by_id[v].name, self.by_id[v])
            for v, kinds in reads.items()
            if None in kinds
            and v in self.at_end
            and self.by_id[v].value.tensor
            and self.by_id[v].name not in self.backward_locals
        ]
        for name, other in held:
            if self.shapes.of(other) == wanted and other.id in self.at_end:
                return METADATA_CODE[kind].format(name)
        return None

    def _value_entry(
        self, version: Version, source: str, ctx: _Context, names: NameAllocator
    ) -> str:
        for saved in ctx.entries:
            if saved.source == source and saved.kind != "metadata":
                return saved.name
        name = names.fresh(source) if source in self.backward_locals else source
        ctx.entries.append(self._classify(version, name, source))
        ctx.versions[name] = version.id
        return name

    def _classify(self, version: Version, name: str, source: str) -> Saved:
        final = version.id in self.at_end
        params = [p.name for p in self.diff.params]
        where = origin(self.diff, source, self.rebound) if final else None
        if version.is_param and final:
            where = ("input", params.index(source))
        # A snapshot of a parameter, or a name bound to another's object, may be an input.
        alias = (
            version.is_param
            or source in params
            or source in self.lifted.aliases
            or version.name in self.lifted.aliases
            or (version.id in self.may_end_as and version.id not in self.where_bound)
        )
        saved = classify(self.diff, name, source, version.value, where, 0, alias)
        if version.in_branch and not final or NONE in version.value.kinds:
            # Bound on one path only, or an `Optional` parameter left None.
            saved = replace(saved, may_be_none=True)
        return saved

    def _meta_entry(
        self, source: str, kind: str, ctx: _Context, names: NameAllocator
    ) -> str:
        code = METADATA_CODE[kind].format(source)
        for saved in ctx.entries:
            if saved.kind == "metadata" and saved.expression == code:
                return saved.name
        name = names.fresh(f"{source}_{kind}")
        where = origin(self.diff, source, self.rebound)
        ctx.entries.append(
            Saved(
                name,
                source,
                "metadata",
                code,
                "object",
                False,
                where[1] if where else None,
                0,
                on=where[0] if where else None,
            )
        )
        return name

    def _recompute(
        self,
        recompute: list[tuple[Saved, str]],
        entries: list[Saved],
        ctx: _Context,
        names: NameAllocator,
    ) -> Recompute | None:
        if not recompute:
            return None
        wanted = {t.source for t, _ in recompute}
        statements, leaves = _replay(self.diff.statements, wanted, self.lifted.values)
        self._check_replay(statements, recompute)
        reads = set().union(*(_names_read(s) for s in statements))
        # A parameter forward rebinds before the replay is a leaf (its value then),
        # not the argument.
        params = [p.name for p in self.diff.params if p.name in reads - set(leaves)]
        args = []
        for param in params:
            version = self.program.params[param]
            before = len(ctx.entries)
            if param in self.rebound:
                # Forward rebinds it: keep the argument's own object, taken at the start.
                first = names.fresh(f"{param}_0")
                ctx.lines.snapshot(None, first, param)
                index = [p.name for p in self.diff.params].index(param)
                ctx.entries.append(
                    classify(
                        self.diff,
                        first,
                        param,
                        version.value,
                        ("input", index),
                        0,
                        False,
                        expression=first,
                    )
                )
                args.append(first)
            else:
                args.append(self._value_entry(version, param, ctx, names))
            entries += ctx.entries[before:]
        for leaf in leaves:
            # A value without gradient that forward computed once: saved, not
            # replayed (a replay of `mask.bernoulli_(p)` would draw a new mask).
            before = len(ctx.entries)
            version = self.program.final[leaf]
            args.append(self._value_entry(version, leaf, ctx, names))
            entries += ctx.entries[before:]
        # A value some path through forward leaves unbound (`s`, bound under
        # `if gate:` only) is None there, as in forward's context: backward reads it
        # only under the same test.
        unbound = [
            cst.parse_statement(f"{name} = None  # unless a branch below binds it\n")
            for name in dict.fromkeys(t.source for t, _ in recompute)
            if name in self.program.final
            and self.program.final[name].id in self.program.partial
        ]
        return Recompute(
            function=names.fresh(f"{self.diff.name}_recompute"),
            params=tuple(params + leaves),
            args=tuple(args),
            statements=(*unbound, *statements),
            returns=tuple(t.source for t, _ in recompute),
            targets=tuple(t.name for t, _ in recompute),
            reasons=tuple(f"`{t.name}`: {why}" for t, why in recompute),
        )

    def _check_replay(
        self,
        statements: Sequence[cst.BaseStatement],
        recompute: list[tuple[Saved, str]],
    ) -> None:
        """Reject a recomputation that would replay a random draw (S2S121)."""
        # Lines, and the tests of `if`s: a replayed test that draws could take the
        # other branch.
        parts = [
            (part, part.test if isinstance(part, cst.If) else part)
            for statement in statements
            for part in findall(statement, (cst.SimpleStatementLine, cst.If))
        ]
        for statement, searched in parts:
            for call in findall(searched, cst.Call):
                name = self._random_call(call, self.diff.qualified_names)
                if name is None:
                    continue
                line = self.diff.statement_lines.get(statement, self.diff.first_line)
                text = self.source[line - 1] if 0 < line <= len(self.source) else ""
                column = (
                    text.find(code(call.func)) + 1 or len(text) - len(text.lstrip()) + 1
                )
                temps = ", ".join(f"`{t.name}`" for t, _ in recompute)
                raise TransformError(
                    [
                        Diagnostic(
                            "S2S121",
                            f"backward must recompute {temps} "
                            f"({recompute[0][1]}), but line {line} draws random "
                            f"numbers (`{name.rsplit('.', 1)[-1]}`): a replay would "
                            "draw different ones",
                            self.path,
                            line,
                            column,
                            text,
                            "compute the random part as a value without gradient "
                            "(`mask = torch.rand_like(x) > p`) and use it in "
                            "differentiable ops, or give backward what it needs "
                            "without that temporary",
                        )
                    ]
                )

    def _random_call(
        self,
        call: cst.Call,
        qualified: Mapping[cst.CSTNode, str],
        depth: int = 0,
    ) -> str | None:
        """The random op `call` runs, itself or inside a helper of the module it
        calls (`_noise(x)` whose body calls `torch.randn_like`); None if none."""
        func = call.func
        if isinstance(func, cst.Name) and func.value in self.siblings:
            return self.siblings[func.value].draws  # `drop(x, p)[0]`, replayed
        name = qualified.get(func) if dotted(func) else None
        if name is None and isinstance(func, cst.Attribute):
            name = f"torch.Tensor.{func.attr.value}"
        if name is not None and opfacts.is_random(name) and draws_here(call, name):
            return name
        helper = (
            self.facts.helpers.get(func.value) if isinstance(func, cst.Name) else None
        )
        if helper is None or depth >= 4:
            return None
        for inner in findall(helper.node.body, cst.Call):
            found = self._random_call(inner, helper.qualified_names, depth + 1)
            if found is not None:
                return found
        return None


def _guarded_by(block: cst.BaseStatement, names: set[str]) -> bool:
    """Whether `block` is `if g is not None:` for one of `names`."""
    return (
        isinstance(block, cst.If)
        and isinstance(block.test, cst.Comparison)
        and isinstance(block.test.left, cst.Name)
        and block.test.left.value in names
        and len(block.test.comparisons) == 1
        and isinstance(block.test.comparisons[0].operator, cst.IsNot)
    )


#: Metadata that two tensors of one shape class share (dtype and device may differ).
_SHAPELIKE = frozenset({"shape", "dim", "numel"})


def _read(text: str) -> cst.BaseExpression:
    """A name, or `t.shape`, as an expression."""
    return cst.Name(text) if text.isidentifier() else cst.parse_expression(text)


def _ordinal(program: Program, version: Version) -> int:
    return [v for v in program.versions if v.name == version.name].index(version)


def _add_into(total: str, grad: str) -> cst.BaseStatement:
    return cst.parse_statement(f"{total} = {ACCUMULATE}({total}, {grad})\n")


def _names_read(node: cst.CSTNode) -> set[str]:
    return spelled(node)


def _replay(
    statements: Sequence[cst.BaseStatement],
    wanted: set[str],
    values: Mapping[str, Value],
) -> tuple[list[cst.BaseStatement], list[str]]:
    """The forward statements to replay for `wanted`, and the leaves they read.

    A leaf is a value without gradient that forward finished computing before the
    first replayed statement reading it: it is saved and passed in, not replayed.
    Everything else a replayed statement reads is replayed too (or is an input). A
    value that a replayed statement also binds (`t1, c3 = t1 * a, torch.ones_like(x)`)
    cannot be a leaf, since the replay would rebind it: it is replayed with every
    statement that changes it (`c3.mul_(0.5)`), which takes another pass.
    """
    written = [writes(s) for s in statements]
    replayed_too: set[str] = set()
    while True:
        needed = set(wanted)
        kept: list[int] = []
        leaves: dict[str, None] = {}
        replayed: set[str] = set()
        for i in reversed(range(len(statements))):
            if not written[i] & needed:
                continue
            kept.append(i)
            replayed |= written[i]
            for name in sorted(_names_read(statements[i])):
                value = values.get(name)
                writers = [j for j, w in enumerate(written) if name in w]
                if (
                    value is not None
                    and not value.diff
                    and writers
                    and max(writers) < i
                    and name not in replayed_too
                ):
                    leaves[name] = None
                else:
                    needed.add(name)
        clobbered = {name for name in leaves if name in replayed} - replayed_too
        if not clobbered:
            break
        replayed_too |= clobbered
    order = [name for name in leaves if name not in replayed and name not in needed]
    return [statements[i] for i in sorted(kept)], order


def _backward_locals(diff: Differentiator, body: cst.BaseSuite) -> set[str]:
    return {p.name.value for p in diff.backward.params.params} | bound(body)


def sibling_of(
    diff: Differentiator, result: Value = UNKNOWN, draw: str | None = None
) -> Sibling:
    """Describe a differentiator as the rule for calls to it from its siblings."""
    names = Names.of(diff.name)
    returns = findall(diff.backward.body, cst.Return)
    bare = len(diff.params) == 1 and not any(
        isinstance(r.value, cst.Tuple) for r in returns
    )
    params = tuple(p.name for p in diff.params)
    return Sibling(diff.name, params, names.forward, names.backward, bare, result, draw)


def module_facts(parsed: ParsedModule) -> tuple[dict[str, Sibling], ModuleFacts]:
    """Describe every differentiator of a module as a rule for the others, and what
    the module tells about calls (their results, its helpers).

    What each one returns depends on what the others it calls return: a few rounds
    over the module reach the answer whatever the order they are defined in. A round
    that changes nothing is the answer (the next would compute the same again).
    """
    diffs = parsed.differentiators
    constant = Evaluator({}, {})
    constants = {n: constant.expr(e) for n, e in parsed.constants.items()}
    facts = ModuleFacts({d.name: UNKNOWN for d in diffs}, parsed.helpers, constants)
    for _ in range(min(len(diffs), 4)):
        results = {d.name: result_value(d, facts) for d in diffs}
        settled = results == facts.siblings
        facts = ModuleFacts(results, parsed.helpers, constants)
        if settled:
            break
    siblings = {
        d.name: sibling_of(
            d, facts.siblings[d.name], draws(d.statements, d.qualified_names, parsed)
        )
        for d in diffs
    }
    return siblings, facts


def differentiate(
    lifted: Lifted,
    options: Options,
    lines: Sequence[str],
    siblings: Mapping[str, Sibling] | None = None,
    facts: ModuleFacts | None = None,
    path: str = "<source>",
) -> Differentiated:
    """Complete `lifted` with the gradients of its temporaries (`lines`: the source
    module's, for the comments that quote it)."""
    return Planner(lifted, options, lines, siblings, facts, path).plan()


def _comments(blocks: Sequence[cst.BaseStatement]) -> list[cst.Comment]:
    """The comments of `blocks`, in order."""
    found: list[cst.Comment] = []

    class _Collect(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            found.append(node)

    for block in blocks:
        walk(block, _Collect())
    return found
