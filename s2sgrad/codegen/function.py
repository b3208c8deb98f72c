"""Emit the `torch.autograd.Function` of one differentiator, and its op.

Takes a `Differentiated` record; returns the source of `FFunction` (new-style `forward`,
`setup_context`, `backward`) and of the op `f` (DESIGN section 4). Invariants:

- `forward` calls `f_forward` once. It returns the result's outputs, the promoted
  temporaries, then one opaque tuple with the other values backward needs (constants,
  metadata of temporaries): autograd does not look inside a tuple, so those are not
  outputs to it and need no `mark_non_differentiable`.
- `setup_context` only unpacks and saves: tensors with `save_for_backward` in the order
  `f_backward` unpacks them (tensors come first in the context), so
  `ctx.saved_tensors` is handed over as is; metadata of inputs and outputs is read
  there. When a value's kind is known only at run time, `_save` decides then.
- `backward` hands the context to `f_backward` once and maps its gradients back to the
  Function's inputs: `None` for non-tensors, one gradient per element of a list.
- A list parameter is flattened into the Function's inputs (its length known at call
  time, as TorchScript flattens `Tensor[]`); a list output is flattened into the
  Function's outputs, and the op rebuilds it.
- A closure with fewer gradient parameters than outputs (`topk`'s `values, indices`)
  gets the gradients of the floating-point outputs, in order: `setup_context` records
  which outputs those are (`_floating_likes`), `backward` takes a slot per output and
  hands them on (`_floating_grads`), raising where the count differs at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.record import Differentiated
from s2sgrad.codegen import docs, types
from s2sgrad.codegen.replay import replay
from s2sgrad.cst import module
from s2sgrad.lift import Saved, hidden_gradient, may_be_view
from s2sgrad.lines import split_lines
from s2sgrad.names import NameAllocator, Names
from s2sgrad.values import BOTTOM, TENSOR, param_value

#: Attributes of autograd's ctx that a saved value must not overwrite.
CTX_API = frozenset(
    {
        "saved_tensors",
        "needs_input_grad",
        "mark_dirty",
        "mark_non_differentiable",
        "save_for_backward",
        "set_materialize_grads",
        "materialize_grads",
        "saved_variables",
        "to_save",
        "dirty_tensors",
        "non_differentiable",
        "save_for_forward",
        "next_functions",
        "metadata",
        "name",
        "register_hook",
        "register_prehook",
        "apply",
        "apply_jvp",
        "kept",
    }
)

#: Names that are values, not variables: an output `None` is named like any expression.
_CONSTANTS = frozenset({"None", "True", "False"})


def uses_save_helpers(record: Differentiated) -> bool:
    """Whether the context needs `_save`/`_saved`: a kind known only at run time, or
    more than one list of tensors."""
    storages = [s.storage for s in record.context]
    return "unknown" in storages or storages.count("tensors") > 1


@dataclass(frozen=True)
class _Input:
    """One forward parameter as the Function takes it."""

    name: str
    keyword_only: bool
    #: A list of tensors: flattened into the Function's inputs.
    listed: bool
    #: What f_forward gets for a flattened list: `list` or `tuple`.
    form: str
    #: Whether it is a tensor: True, False (never gets a gradient) or None (decided
    #: at run time by `needs_input_grad`).
    tensor: bool | None


@dataclass(frozen=True)
class _Output:
    """One output of the result."""

    var: str
    #: A list (or tuple) of tensors of run-time length.
    listed: bool
    form: str
    #: May be an input object itself, or a view of a tensor: returned through `_own`.
    aliased: bool
    #: True: always a tensor; False: never one (no gradient to materialize); None:
    #: known at run time only (a number, None or a tensor).
    tensor: bool | None = True


class FunctionWriter:
    """Write the Function class and the op of one differentiator as source text."""

    def __init__(
        self,
        record: Differentiated,
        names: Names,
        needs: str | None = None,
        pair: tuple[str, str] | None = None,
        handles_none: bool = False,
        literals: frozenset[str] = frozenset(),
        width: int = 88,
    ) -> None:
        self.width = width
        self.record = record
        self.handles_none = handles_none
        self.diff = record.source
        self.names = names
        self.needs = needs
        self.forward_name, self.backward_name = pair or (names.forward, names.backward)
        alloc = NameAllocator(set(record.taken) | {p.name for p in self.diff.params})
        self.ctx = alloc.fresh("ctx")
        self.inputs_name = alloc.fresh("inputs")
        self.output_name = alloc.fresh("output")
        self.inputs = [self._input(i) for i in range(len(self.diff.params))]
        self.listed = [i for i in self.inputs if i.listed]
        #: With several list parameters, all but the last pass their length.
        self.lengths = {
            i.name: alloc.fresh(f"{i.name}_len")
            for i in self.listed[: -1 if len(self.listed) > 1 else 0]
        }
        self.flat = alloc.fresh("tensors") if len(self.listed) > 1 else None
        self.outputs = self._outputs(alloc)
        self.grads = list(self.diff.grad_params)
        incoming = dict(record.gradients.incoming) if record.gradients else {}
        alloc.taken.update(self.grads)
        alloc.taken.update(incoming.values())
        #: Fewer gradient parameters than outputs: they belong to the floating-point
        #: outputs in order, which backward finds at run time; its own gradient slots
        #: are one per output, named after it.
        self.routed = len(self.grads) < len(self.outputs)
        self.slots = (
            [self._slot(o.var, alloc, set(incoming.values())) for o in self.outputs]
            if self.routed
            else self.grads
        )
        self.likes = alloc.fresh("outputs_like") if self.routed else ""
        self.promoted = [s for s in record.context if s.promoted]
        self.incoming = [incoming[s.name] for s in self.promoted]
        self.extras = [s for s in record.extras if not s.promoted]
        self.rest = alloc.fresh("rest")
        self.grads_name = alloc.fresh("grads")
        self.meta = [alloc.fresh(n) for n in ("shape", "dtype", "device")]
        self.pieces = alloc.fresh("pieces")
        self.saved = alloc.fresh("saved")
        self.given = alloc.fresh("given")
        self.unpacked = alloc.fresh("saved_tensors")
        self.result = alloc.fresh("result")
        self.attrs = {
            s.name: (f"saved_{s.name}" if s.name in CTX_API else s.name)
            for s in record.context
            if s.storage == "object"
        }
        self.list_lengths = {
            i.name: alloc.fresh(f"{i.name}_count") for i in self.listed
        }
        # setup_context unpacks inputs and outputs side by side: an input named like an
        # output or extra (a rebound parameter) gets its own name there.
        clash = {o.var for o in self.outputs} | {s.name for s in record.extras}
        self.input_vars = {
            i.name: (alloc.fresh(f"input_{i.name}") if i.name in clash else i.name)
            for i in self.inputs
        }
        self.helpers = uses_save_helpers(record)
        own = {self.ctx, self.inputs_name, self.output_name, self.rest, self.pieces}
        own |= {o.var for o in self.outputs} | set(self.input_vars.values())
        own |= {s.name for s in record.context} - {s.source for s in record.extras}
        self.replay = replay(record, own, literals, self.input_vars)
        if self.replay is not None:
            self.extras = [s for s in self.extras if s not in self.replay.entries]

    def _slot(self, var: str, alloc: NameAllocator, incoming: set[str]) -> str:
        """The Function's gradient slot for an output: `grad_<output>`, which may be a
        gradient parameter's name too (the routed gradients are bound after every
        slot is read, so `grad_y` may take `grad_y`'s gradient again)."""
        name = f"grad_{var}"
        free = name in self.grads and name not in incoming
        return name if free else alloc.fresh(name)

    def _input(self, index: int) -> _Input:
        param = self.diff.params[index]
        value = param_value(param)
        tensor = True if not param.gets_gradient else value.tensor
        return _Input(
            param.name,
            param.keyword_only,
            value.tensor_list,
            value.form if value.form in ("list", "tuple") else "list",
            tensor,
        )

    def _outputs(self, alloc: NameAllocator) -> list[_Output]:
        params = {p.name for p in self.diff.params}
        found = []
        for i, node in enumerate(self.diff.outputs):
            value = self.record.outputs[i] if i < len(self.record.outputs) else BOTTOM
            if isinstance(node, cst.Name) and node.value not in _CONSTANTS:
                var = (
                    node.value
                    if node.value not in params
                    else alloc.fresh(f"output_{i}")
                )
                aliased = node.value in params or node.value in self.record.lifted.views
            else:
                var = alloc.fresh(
                    "result" if not self.diff.tuple_result else f"output_{i}"
                )
                aliased = not isinstance(node, cst.Name) and may_be_view(
                    node, self.diff.qualified_names
                )
            form = value.form if value.form in ("list", "tuple") else "tuple"
            tensor = (
                True
                if value.kinds == {TENSOR}
                else (None if value.holds_tensor else False)
            )
            found.append(_Output(var, value.tensor_list, form, aliased, tensor))
        return found

    @property
    def plain_outputs(self) -> list[_Output]:
        return [o for o in self.outputs if not o.listed]

    @property
    def listed_outputs(self) -> list[_Output]:
        return [o for o in self.outputs if o.listed]

    # -- layout of the Function's inputs and outputs -----------------------------------
    def annotation(self, name: str) -> str:
        """A parameter's annotation in the Function's forward: `Tensor` (or `Grad`) for
        a tensor, otherwise the user's, if any."""
        param = next(p for p in self.diff.params if p.name == name)
        value = param_value(param)
        if value.tensor is True:
            return types.of(value)
        if param.node.annotation is not None:
            return cst.Module([]).code_for_node(param.node.annotation.annotation)
        return types._inferred(param)

    def _head(self) -> list[str]:
        """The leading inputs: parameters in order, a list by its length (if several)."""
        return [
            self.lengths.get(item.name, item.name)
            for item in self.inputs
            if not item.listed or item.name in self.lengths
        ]

    def _elements(self) -> str:
        """The starred name that takes every list element."""
        return self.flat or self.listed[0].name

    def _split(self, source: str, lengths: dict[str, str]) -> list[str]:
        """Lines that cut the flattened elements back into each list (several lists)."""
        lines, start = [], ""
        for item in self.listed:
            if item.name not in lengths:
                lines.append(f"{item.name} = {source}[{start}:]")
            else:
                stop = (
                    f"{start} + {lengths[item.name]}" if start else lengths[item.name]
                )
                lines.append(f"{item.name} = {source}[{start}:{stop}]")
                start = stop
        return lines

    def _returned(self, inputs: str | None = None) -> list[str]:
        """What forward returns, in order."""
        items = [
            self._view(o.var, inputs) if o.aliased else o.var
            for o in self.plain_outputs
        ]
        items += [
            self._view_always(s.name, s.may_be_none) if s.may_alias else s.name
            for s in self.promoted
        ]
        if self.extras:
            items.append(_tuple([s.name for s in self.extras]))
        if len(self.listed_outputs) > 1:
            items.append(_tuple([f"len({o.var})" for o in self.listed_outputs[:-1]]))
        for out in self.listed_outputs:
            if out.aliased:
                items.append(f"*({self._view('p', inputs)} for p in {out.var})")
            else:
                items.append(f"*{out.var}")
        return items

    def _inputs(self) -> list[str]:
        return [f"*{i.name}" if i.listed else i.name for i in self.inputs]

    def _view(self, name: str, inputs: str | None = None) -> str:
        """An output, or a view of it where it is one of forward's inputs or of the
        promoted temporaries returned beside it, or a copy where it is a view
        (`_own`): the caller may change a tensor forward made in place."""
        given = [inputs] if inputs is not None else self._inputs()
        others = [s.name for s in self.promoted]
        return f"_own({', '.join([name, *given, *others])})"

    @staticmethod
    def _view_always(name: str, maybe: bool = False) -> str:
        """A promoted temporary that may be an input or another output's very
        tensor, as a view (autograd saves no input returned as is, and
        torch.compile takes no tensor as two outputs of a Function); the caller
        never sees it."""
        view = f"{name}.view_as({name})"
        return f"({view} if isinstance({name}, Tensor) else {name})" if maybe else view

    def _returns_tuple(self) -> bool:
        return (
            len(self._returned()) > 1
            or self.diff.tuple_result
            or bool(self.listed_outputs)
        )

    # -- the class ----------------------------------------------------------------------
    def write(self) -> str:
        parts = [
            f"class {self.names.function}(_Function):",
            *_indent(self.forward()),
            "",
            *_indent(self.setup_context()),
            "",
            *_indent(self.backward()),
        ]
        return "\n".join(parts) + "\n"

    def forward(self) -> list[str]:
        signature = [
            (
                f"{self.lengths[item.name]}: int"
                if item.name in self.lengths
                else f"{item.name}: {self.annotation(item.name)}"
            )
            for item in self.inputs
            if not item.listed or item.name in self.lengths
        ]
        if self.listed:
            signature.append(f"*{self._elements()}: {types.TENSOR}")
        lines = ["@staticmethod", f"def forward({', '.join(signature)}) -> Any:"]
        if self.flat is not None:
            lines += ["    " + s for s in self._split(self.flat, self.lengths)]
        args = []
        for item in self.inputs:
            value = f"{item.form}({item.name})" if item.listed else item.name
            args.append(f"{item.name}={value}" if item.keyword_only else value)
        call = f"{self.forward_name}({', '.join(args)})"
        returned = self._returned()
        simple = [
            o.var for o in self.plain_outputs
        ] == returned and not self.listed_outputs
        if simple and len(self.outputs) == len(returned):
            return lines + [f"    return {call}[0]"]
        if self.diff.tuple_result:
            result = _tuple([o.var for o in self.outputs])
        else:
            result = self.outputs[0].var
        if self.extras:
            context = _tuple(
                [
                    s.name if s.promoted or s in self.extras else "_"
                    for s in self.record.context
                ]
            )
        elif self.promoted:
            context = _tuple(
                [s.name if s.promoted else "_" for s in self.record.context]
            )
        else:
            context = "_"
        rebound = {i.name for i in self.inputs} & set(
            re.findall(r"\w+", f"{result}, {context}")
        )
        if rebound and any("_own(" in r for r in returned):
            # The unpacking rebinds an input's name: `_own` compares with the
            # inputs as they came.
            lines.append(f"    {self.given} = {_tuple(self._inputs())}")
            returned = self._returned(f"*{self.given}")
        lines.append(f"    {result}, {context} = {call}")
        lines.append(f"    return {_listing(returned)}")
        return lines

    # -- setup_context ------------------------------------------------------------------
    def setup_context(self) -> list[str]:
        lines = [
            "@staticmethod",
            f"def setup_context({self.ctx}: Any, {self.inputs_name}: {types.CONTEXT}, "
            f"{self.output_name}: Any) -> None:",
        ]
        context = self.record.context
        wanted = {
            self.inputs[s.index].name
            for s in context
            if (s.kind == "input" or s.on == "input") and s.index is not None
        }
        if self.replay is not None:
            wanted |= self.replay.params
        if wanted or self.listed:
            lines.append(f"    {self._unpack_inputs(wanted)} = {self.inputs_name}")
            if self.flat is not None:
                lines += ["    " + s for s in self._split(self.flat, self.lengths)]
        if self.replay is not None:  # plain values forward computed: again, from inputs
            code = module(list(self.replay.statements)).code
            lines += ["    " + line if line else line for line in split_lines(code)]
        if self._returns_tuple():
            targets = self._unpack_outputs()
            if len(targets) == 1 and targets[0].startswith("*"):
                lines.append(f"    {targets[0][1:]} = {self.output_name}")
            elif any(t != "_" for t in targets):
                lines.append(f"    {_targets(targets)} = {self.output_name}")
            lines += self._split_pieces()
        values = [self._value(s) for s in context]
        if self.helpers:
            lines.append(f"    _save({self.ctx}, {', '.join(values)})")
        else:
            tensors = [
                (f"*{v}" if s.storage == "tensors" else v)
                for s, v in zip(context, values, strict=True)
                if s.storage in ("tensor", "tensors")
            ]
            if tensors:
                lines.append(f"    {self.ctx}.save_for_backward({', '.join(tensors)})")
            for saved, value in zip(context, values, strict=True):
                if saved.storage == "object":
                    lines.append(f"    {self.ctx}.{self.attrs[saved.name]} = {value}")
        for item in self.listed:
            lines.append(
                f"    {self.ctx}.{self.list_lengths[item.name]} = len({item.name})"
            )
        if self.routed:  # which outputs backward takes gradients for
            floating = ", ".join(o.var for o in self.outputs)
            lines.append(f"    {self.ctx}.{self.likes} = _floating_likes({floating})")
        for out in self.outputs if not self.routed else ():
            if out.listed:
                lines.append(
                    f"    {self.ctx}.{out.var}_like = "
                    f"[(p.shape, p.dtype, p.device) for p in {out.var}]"
                )
            elif self.diff.tuple_result and out.tensor is not False:
                like = f"{out.var}.shape, {out.var}.dtype, {out.var}.device"
                if out.tensor is None:  # zeros only where it is a tensor
                    like = f"({like}) if isinstance({out.var}, Tensor) else None"
                lines.append(f"    {self.ctx}.{out.var}_like = {like}")
        lines.append(f"    {self.ctx}.set_materialize_grads(False)")
        return lines

    def _unpack_inputs(self, wanted: set[str]) -> str:
        targets = []
        for item in self.inputs:
            if item.name in self.lengths:
                targets.append(self.lengths[item.name])
            elif not item.listed:
                targets.append(
                    self.input_vars[item.name] if item.name in wanted else "_"
                )
        if self.listed:
            targets.append(f"*{self._elements()}")
        return _targets(targets)

    def _unpack_outputs(self) -> list[str]:
        needed = {
            s.index
            for s in self.record.context
            if (s.kind == "output" or s.on == "output")
        }
        multi = self.diff.tuple_result
        targets = [
            o.var if (i in needed or multi) else "_"
            for i, o in enumerate(self.outputs)
            if not o.listed
        ]
        targets += [s.name for s in self.promoted]
        if self.extras:
            targets.append(_tuple([s.name for s in self.extras]))
        if len(self.listed_outputs) > 1:
            targets.append(_tuple([f"{o.var}_len" for o in self.listed_outputs[:-1]]))
        if len(self.listed_outputs) == 1:
            targets.append(f"*{self.listed_outputs[0].var}")
        elif self.listed_outputs:
            targets.append(f"*{self.pieces}")
        kept = list(targets)
        while kept and kept[-1] == "_":
            kept.pop()
        return kept + ["*_"] if len(kept) < len(targets) and kept else targets

    def _split_pieces(self) -> list[str]:
        """Several list outputs come flattened into one run of pieces: cut it up."""
        listed = self.listed_outputs
        if len(listed) < 2:
            return []
        lines, start = [], ""
        for k, out in enumerate(listed):
            if k == len(listed) - 1:
                lines.append(f"    {out.var} = {self.pieces}[{start}:]")
                continue
            stop = f"{start} + {out.var}_len" if start else f"{out.var}_len"
            lines.append(f"    {out.var} = {self.pieces}[{start}:{stop}]")
            start = stop
        return lines

    def _value(self, saved: Saved) -> str:
        """The setup_context expression of one context entry."""
        if saved.kind == "output" or saved.on == "output":
            assert saved.index is not None
            var = (
                self.outputs[saved.index].var
                if self._returns_tuple()
                else self.output_name
            )
        elif saved.kind == "input" or saved.on == "input":
            assert saved.index is not None
            var = self.input_vars[self.inputs[saved.index].name]
        else:
            return saved.name
        if saved.kind == "metadata":
            return saved.expression.replace(saved.source, var, 1)
        return var

    # -- backward -----------------------------------------------------------------------
    def backward(self) -> list[str]:
        lines = ["@staticmethod"]
        if self.record.first_order:
            lines.append(f'@_FirstOrder("{self.diff.name}")')
        elif (why := hidden_gradient(self.diff)) is not None:
            lines.append(f'@_NoForwardMode("{self.diff.name}", "{why}")')
        pairs = list(zip(self.slots, self.outputs, strict=True))
        plain = [g for g, o in pairs if not o.listed]
        listed = [g for g, o in pairs if o.listed]
        params = [f"{self.ctx}: Any"]
        params += [f"{g}: {types.GRAD}" for g in (*plain, *self.incoming)]
        skipped = int(bool(self.extras)) + int(len(self.listed_outputs) > 1)
        if self.listed_outputs:
            params.append(f"*{self.rest}: {types.GRAD}")
        elif skipped:
            params.append("*_: Any")
        lines.append(f"def backward({', '.join(params)}) -> Any:")
        if self.incoming:
            lines += [
                "    if torch.compiler.is_compiling():  # only a double backward sends "
                "these",
                f"        {' = '.join(self.incoming)} = None",
            ]
        lines += self._listed_grads(listed, skipped)
        tests = [f"{g} is None" for g in (*plain, *self.incoming)]
        tests += [f"all(g is None for g in {g})" for g in listed]
        nones = self._nones()
        if not self.handles_none or self.diff.tuple_result or listed:
            # The closure expects tensors: skip it when no gradient arrived at all.
            lines += [f"    if {' and '.join(tests)}:", f"        return {nones}"]
        lines += self._routed() if self.routed else self._materialize(plain, listed)
        keywords = [f"{k}={k}" for k in self.incoming]
        if self.needs:
            keywords.append(f"{self.needs}={self._needs()}")
        context = self._context()
        if f"{self.unpacked}[" in context:
            # Unpacked once: non-reentrant checkpointing refuses a second unpack.
            lines.append(f"    {self.unpacked} = {self.ctx}.saved_tensors")
        args = ", ".join([context, *self.grads, *keywords])
        if len(f"        return {self.backward_name}({args})") > self.width and (
            not context.isidentifier() and "." in context and "(" in context
        ):
            # The context on a line of its own keeps the call on one.
            lines.append(f"    {self.saved} = {context}")
            args = ", ".join([self.saved, *self.grads, *keywords])
        lines += self._return(f"{self.backward_name}({args})", nones)
        return lines

    def _listed_grads(self, listed: list[str], skipped: int) -> list[str]:
        """Take each list output's gradients from the trailing ones."""
        lines = []
        start = str(skipped) if skipped else ""
        for k, (grad, out) in enumerate(zip(listed, self.listed_outputs, strict=True)):
            if k == len(listed) - 1:
                tail = f"{self.rest}[{start}:]" if start else self.rest
                lines.append(f"    {grad}: list[Any] = list({tail})")
            else:
                count = f"len({self.ctx}.{out.var}_like)"
                stop = f"{start} + {count}" if start else count
                lines.append(
                    f"    {grad}: list[Any] = list({self.rest}[{start}:{stop}])"
                )
                start = stop
        return lines

    def _materialize(self, plain: list[str], listed: list[str]) -> list[str]:
        """Zeros for the gradients nobody sent, where the closure expects tensors."""
        lines = []
        if self.diff.tuple_result:
            for grad, out in zip(plain, self.plain_outputs, strict=True):
                if out.tensor is False:
                    continue  # a number, a string...: no gradient, None stays
                test = f"{grad} is None"
                if out.tensor is None:
                    test += f" and {self.ctx}.{out.var}_like is not None"
                lines += [
                    f"    if {test}:",
                    f"        {', '.join(self.meta)} = {self.ctx}.{out.var}_like",
                    f"        {grad} = torch.zeros({self.meta[0]}, dtype={self.meta[1]}, "
                    f"device={self.meta[2]})",
                ]
        for grad, out in zip(listed, self.listed_outputs, strict=True):
            lines += [
                f"    {grad} = [",
                "        torch.zeros(s, dtype=d, device=v) if g is None else g",
                f"        for g, (s, d, v) in zip({grad}, {self.ctx}.{out.var}_like, strict=True)",
                "    ]",
            ]
        return lines

    def _routed(self) -> list[str]:
        """The closure's gradients: those of the floating-point outputs, in order."""
        taken = _targets(self.grads)
        slots = ", ".join(self.slots)
        bname = self.diff.backward.name.value
        return [
            f"    # `{bname}` takes the floating-point outputs' gradients, in order",
            f"    {taken} = _floating_grads({self.diff.name!r}, {len(self.grads)}, "
            f"{self.ctx}.{self.likes}, {slots})",
        ]

    def _context(self) -> str:
        """The context tuple f_backward unpacks, rebuilt from what setup_context kept."""
        context = self.record.context
        if not context:
            return "()"
        if self.helpers:
            return f"_saved({self.ctx})"
        saved = f"{self.ctx}.saved_tensors"
        objects = [
            f"{self.ctx}.{self.attrs[s.name]}" for s in context if s.storage == "object"
        ]
        lists = [s for s in context if s.storage == "tensors"]
        if lists:
            k = sum(s.storage == "tensor" for s in context)
            if not k:
                return _tuple([f"list({saved})", *objects])
            unpacked = self.unpacked
            head = [f"*{unpacked}[:{k}]", f"list({unpacked}[{k}:])"]
            return _tuple([*head, *objects])
        if not objects:
            return saved
        return _tuple([f"*{saved}", *objects])

    def _needs(self) -> str:
        """`needs_input_grad` per forward parameter (for a list: any of its elements)."""
        needs = f"{self.ctx}.needs_input_grad"
        if not self.listed:
            return needs
        head = len(self._head())
        items = []
        position = 0
        start = str(head)
        for item in self.inputs:
            if not item.listed:
                items.append(f"{needs}[{position}]")
                position += 1
                continue
            if item.name in self.lengths:
                position += 1
            count = f"{self.ctx}.{self.list_lengths[item.name]}"
            stop = f"{start} + {count}"
            items.append(f"any({needs}[{start}:{stop}])")
            start = stop
        return _tuple(items)

    def _nones(self) -> str:
        if self.listed:
            return f"(None,) * len({self.ctx}.needs_input_grad)"
        return ", ".join(["None"] * len(self.inputs))

    def _return(self, call: str, nones: str) -> list[str]:
        """Return one gradient per Function input: None where none can be taken."""
        bare_none = self.diff.returns_bare_none and len(self.inputs) > 1
        plain = [i for i in self.inputs if not i.listed]
        # A list, or a name bound to one, reaches autograd as a tuple of its entries.
        as_is = self.diff.returns_tuples or len(self.inputs) == 1
        if all(i.tensor is True for i in plain) and as_is and not bare_none:
            if not self.listed:
                return [f"    return {call}"]
        grads = self.grads_name
        lines = [f"    {grads} = {call}"]
        if len(self.inputs) == 1 and self.listed:
            # One parameter: backward may return its gradients bare, or in a 1-tuple.
            count = f"{self.ctx}.{self.list_lengths[self.inputs[0].name]}"
            return lines + [
                f"    if type({grads}) is tuple and len({grads}) == 1 and not "
                f"isinstance({grads}[0], torch.Tensor):",
                f"        {grads} = {grads}[0]",
                f"    return tuple({grads} if {grads} is not None else [None] * {count})",
            ]
        if bare_none:
            lines += [f"    if {grads} is None:", f"        return {nones}"]
        head: list[str] = []
        tail: list[str] = []
        position = 0
        for i, item in enumerate(self.inputs):
            entry = f"{grads}[{i}]"
            if item.listed:
                count = f"{self.ctx}.{self.list_lengths[item.name]}"
                tail.append(f"*({entry} if {entry} is not None else [None] * {count})")
                if item.name in self.lengths:
                    head.append("None")
                    position += 1
                continue
            if item.tensor is False:
                head.append("None")
            elif item.tensor is None:
                # A number where a tensor may be passed takes no gradient: autograd
                # wants None there, and needs_input_grad says which it was.
                head.append(
                    f"{entry} if {self.ctx}.needs_input_grad[{position}] else None"
                )
            else:
                head.append(entry)
            position += 1
        items = head + tail
        lines.append(f"    return {_listing(items)}")
        return lines

    # -- the op ---------------------------------------------------------------------
    def op_body(self) -> list[str]:
        """Call apply and hand back the result as the closure returned it."""
        args = [
            f"len({item.name})" if item.name in self.lengths else item.name
            for item in self.inputs
            if not item.listed or item.name in self.lengths
        ]
        args += [f"*{item.name}" for item in self.listed]
        call = f"{self.names.function}.apply({', '.join(args)})"
        returned = self._returned()
        n_outputs = len(self.outputs)
        result = self.result_type()
        if not self.listed_outputs:
            if len(returned) == n_outputs:
                value = call
            elif self.diff.tuple_result:
                value = f"{call}[:{n_outputs}]"
            else:
                value = f"{call}[0]"
            params = {p.name for p in self.diff.params}
            if not params & {"cast", types.TENSOR}:
                return [f"return cast({result}, {value})"]
            # A parameter named `cast` or `Tensor` hides the module's own: the result
            # is typed by an annotation, spelled `torch.Tensor` where need be.
            if types.TENSOR in params:
                result = re.sub(rf"\b{types.TENSOR}\b", "torch.Tensor", result)
            out = NameAllocator(set(self.record.taken) | params).fresh("result")
            return [f"{out}: {result} = {value}", f"return {out}"]
        out = NameAllocator(
            set(self.record.taken) | {p.name for p in self.diff.params}
        ).fresh("out")
        lines = [f"{out} = {call}"]
        skip = len(returned) - len(self.listed_outputs)
        lengths_at = skip - 1
        pieces, plain, start = [], 0, str(skip)
        listed = self.listed_outputs
        for o in self.outputs:
            if not o.listed:
                pieces.append(f"{out}[{plain}]")
                plain += 1
            elif o is listed[-1]:
                tail = f"{out}[{start}:]" if start != "0" else out
                pieces.append(f"{o.form}({tail})")
            else:
                stop = f"{start} + {out}[{lengths_at}][{listed.index(o)}]"
                pieces.append(f"{o.form}({out}[{start}:{stop}])")
                start = stop
        if self.diff.tuple_result:
            lines.append(f"return {_tuple(pieces)}")
        else:
            lines.append(f"return {pieces[0]}")
        return lines

    def result_type(self) -> str:
        return types.of_result(self.record.outputs, self.diff.tuple_result)


def _indent(lines: list[str]) -> list[str]:
    return [("    " + line) if line else "" for line in lines]


def _tuple(items: list[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return f"({', '.join(items)})"


def _listing(items: list[str]) -> str:
    """Items to return: `a, b`; one plain item alone; one `*starred` as a tuple."""
    if len(items) == 1 and items[0].startswith("*("):
        return f"tuple{items[0][1:]}"
    if len(items) == 1 and items[0].startswith("*"):
        return f"tuple({items[0][1:]})"
    if len(items) == 1:
        return items[0]
    return ", ".join(items)


def _targets(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else ", ".join(items)


def function_class(
    record: Differentiated,
    names: Names,
    needs: str | None,
    pair: tuple[str, str],
    handles_none: bool,
    literals: frozenset[str] = frozenset(),
    width: int = 88,
) -> str:
    """The Function class, as code with the two blank lines above it (written as
    text, it is never parsed: codegen renders the module statement by statement);
    `literals` are the module's constants whose values are literals (setup_context
    may read them)."""
    writer = FunctionWriter(record, names, needs, pair, handles_none, literals, width)
    return "\n\n" + writer.write()


def op_def(
    record: Differentiated,
    names: Names,
    path: str,
    literals: frozenset[str] = frozenset(),
) -> cst.FunctionDef:
    """The op `f`: the source signature, calling the Function (which returns what
    `function_class`'s writer, given the same `literals`, makes it return)."""
    writer = FunctionWriter(record, names, literals=literals)
    doc = cst.SimpleStatementLine(
        [cst.Expr(cst.SimpleString(docs.docstring(docs.op_doc(record, path), "    ")))]
    )
    body = [doc, *(cst.parse_statement(line + "\n") for line in writer.op_body())]
    return cst.FunctionDef(
        name=cst.Name(names.op),
        params=types.annotated(record.source.forward.params, record.source.params),
        body=cst.IndentedBlock(body),
        returns=cst.Annotation(cst.parse_expression(writer.result_type())),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )
