"""Check a closure-style gradient rule against torch.autograd: `check_gradients`.

The closure's forward is plain torch, so torch.autograd through it is an exact oracle:
first for the user's own backward (first order), then for the op s2sgrad generates from
the closure at every order up to `order`, in the two shapes of DESIGN.md section 10:
each order alone (order k+1 of `sum(v * grad_k)`) and mixed with the output (one
backward of `sum(w * out) + sum(v * grad)`, as a gradient penalty takes it), then in
forward mode (the op's `jvp` against its own vector-Jacobian products, which are
checked by then). The inputs checked are the tensors that require grad, as
`torch.autograd.gradcheck` takes them; where the examples mark none, every
floating-point tensor. A differentiator whose backward is meant to differ from
forward's derivative says so with `# s2sgrad: surrogate=true`, and the oracle is then
the derivative that backward defines, at every order (`_Surrogate`).

A backward with fewer gradient parameters than the closure has outputs, as
TorchScript's closures write `topk` (`return values, indices, backward` with
`def backward(grad_output)`), takes the gradients of the floating-point (or complex)
tensor outputs, in order, as the generated op hands them (`_floating_grads`); the other
outputs are weighted by nothing, and the op's integer and bool outputs are compared
with the closure's for equal values. Where the count differs for the example inputs,
the check reports that instead of a gradient.

Gradients are compared as weighted sums with random weights (vector-Jacobian products),
never by finite differences, at tolerances of the inputs' dtype. A mismatch raises
`AssertionError` with a report a user can act on: the parameter, the order and shape of
the loss, the largest absolute and relative errors (the expected magnitude where it is
0), the shapes, and the line of the closure's `backward` that returns that gradient.

`s2sgrad check` (cli.py) runs the same check for the differentiators a module gives
example inputs for in `S2SGRAD_EXAMPLES`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import linecache
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import libcst as cst
import torch
from libcst.metadata import MetadataWrapper, PositionProvider

from s2sgrad.diagnostics import TransformError
from s2sgrad.frontend.checks import returned_pair
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.parse import read_pragmas
from s2sgrad.options import Options
from s2sgrad.sources import display_path

__all__ = ["Checked", "Mismatch", "check_gradients", "check_module", "generated_op"]

#: (rtol, atol) per dtype; atol is scaled by 1 + the largest expected magnitude.
_TOLERANCES = {
    torch.float64: (1e-6, 1e-9),
    torch.complex128: (1e-6, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
}
_LOW_PRECISION = (1e-2, 1e-3)  # float16, bfloat16
#: Seed offsets of the mixed losses' weights and of forward mode's tangents, apart
#: from the pure chain's (seed + level).
_MIXED, _TANGENTS = 1000, 2000
_SURROGATE = "`# s2sgrad: surrogate=true`"
#: What each shape of loss is called in a report, long (its heading) and short.
_SHAPES = {
    "alone": ("", ""),
    "mixed": (
        " mixed with the output (one backward of sum(w * out) + sum(v * grad), as a "
        "gradient penalty takes it)",
        " mixed with the output",
    ),
    "forward": (
        " in forward mode (the op's jvp, by the dot-product test with its reverse "
        "mode)",
        " in forward mode",
    ),
}


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One wrong gradient: of `parameter`, at `order`, from `what`."""

    parameter: str
    order: int
    what: str
    max_abs: float
    #: over the wrong entries whose expected value is not 0; None where all are 0
    max_rel: float | None
    shape: tuple[int, ...] | None
    expected_shape: tuple[int, ...]
    returned_at: str
    #: the loss: "alone" (order k of `sum(v * grad_k-1)`), "mixed" (with the output
    #: and the lower orders in one loss) or "forward" (the op's jvp)
    kind: str = "alone"
    #: the largest expected magnitude, given where some wrong entry expects 0
    scale: float | None = None
    #: forward mode: sum(u * jvp(t)) and sum(vjp(u) * t), which should be equal
    products: tuple[float, float] | None = None
    #: kind "value" (an integer or bool output of the op, or a number, differs from
    #: the closure's): how; `parameter` then names the output
    detail: str = ""

    def heading(self) -> str:
        if self.kind == "value":
            return "its outputs' values"
        return f"order {self.order}{_SHAPES[self.kind][0]}"

    def describe(self) -> str:
        if self.kind == "value":
            return f"- {self.parameter}, {self.what}: {self.detail}"
        label = f"gradient of `{self.parameter}`, order {self.order}"
        label += f"{_SHAPES[self.kind][1]}, {self.what}"
        if self.products is not None:
            jvp, vjp = self.products
            where = "every input" if ", " in self.parameter else "this input alone"
            return (
                f"- {label}: sum(u * jvp(t)) = {jvp:.6g}, sum(vjp(u) * t) = {vjp:.6g} "
                f"(tangent t in {where}; abs error {self.max_abs:.3g})"
            )
        return f"- {label}: {self._error()}\n  returned by {self.returned_at}"

    def _error(self) -> str:
        if self.shape is None:
            return "no gradient (None), expected one"
        if self.shape != self.expected_shape:
            return f"shape {self.shape}, expected {self.expected_shape}"
        if self.max_rel is None:
            text = f"max abs error {self.max_abs:.3g} where 0 is expected"
        else:
            text = f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}"
        notes = [f"shape {self.shape}"]
        if self.scale is not None:
            notes.insert(0, f"largest expected magnitude {self.scale:.3g}")
            if self.max_rel is not None:
                notes.insert(0, "0 is expected at some wrong entries")
        return f"{text} ({'; '.join(notes)})"


def check_gradients(
    fn: Callable[..., Any], *args: Any, order: int = 2, seed: int = 0, **kwargs: Any
) -> str:
    """Check `fn`'s backward, then the op s2sgrad generates from `fn`, against
    torch.autograd through `fn`'s own forward; raise `AssertionError` on a mismatch,
    else return one line that says what was checked.

    `fn` is the closure-style function as written (forward returning its result and a
    `backward` closure); `args` and `kwargs` are example inputs: tensors, lists of
    tensors, and plain values. The tensors that require grad are checked, as
    `torch.autograd.gradcheck` checks them; where none does, every floating-point one.
    Orders 2 and up check the generated op (its gradients of gradients, each order
    alone and mixed with the output), which is where a backward that is right once but
    not differentiable (`.detach()`, `.data`) shows; then its forward mode. With
    `# s2sgrad: surrogate=true` in `fn`, the op is checked against the derivative
    `fn`'s backward defines instead.
    """
    outcome = _check(fn, args, kwargs, order, seed, Options())
    if outcome.wrong:
        raise AssertionError(outcome.text)
    return outcome.text


def _check(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    order: int,
    seed: int,
    options: Options,
) -> _Outcome:
    """Whether `fn`'s gradients are wrong, and the report or what was checked."""
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    rule = _Rule(fn, args, kwargs)
    unfit = rule.unfit(seed)
    if unfit is not None:
        return _Outcome(True, unfit, rule.surrogate)
    found = [] if rule.surrogate else rule.check_backward(seed)
    if not found:
        found = rule.check_op(generated_op(fn, options), order, seed)
    text = rule.report(found) if found else rule.summary(order)
    return _Outcome(bool(found), text, rule.surrogate)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    wrong: bool
    #: the report where wrong, else one line that says what was checked
    text: str
    #: checked against the user's backward (`# s2sgrad: surrogate=true`)
    surrogate: bool


class _Rule:
    """A closure-style function with example inputs, and the inputs it is checked in."""

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        self.fn = fn
        signature = inspect.signature(fn)
        self.bound = signature.bind(*args, **kwargs)
        self.names = list(signature.parameters)
        self.source = _Source(fn)
        self.surrogate = self.source.pragmas.get("surrogate") == "true"
        self.backward: Callable[..., Any] | None = None
        #: how many outputs the closure's `return` lists (`return a, b, backward` or
        #: `return (a, b), backward`); None where it returns one expression, which may
        #: be a list output
        self.listed = self.source.outputs
        #: the outputs backward takes gradients for, where it takes fewer than there
        #: are outputs (their positions); None where it takes one per output
        self.taken: list[int] | None = None
        #: (label such as `x` or `xs[1]`, parameter, index in its list, tensor)
        self.inputs = _checked_inputs(self.bound.arguments)
        self.labels = [label for label, *_ in self.inputs]

    # -- inputs ----------------------------------------------------------------------

    def leaves(self) -> list[torch.Tensor]:
        """Fresh leaves that require grad, one per checked input."""
        return [t.detach().clone().requires_grad_() for *_, t in self.inputs]

    def call(self, fn: Callable[..., Any], values: Sequence[Any], seed: int) -> Any:
        """`fn` on the example inputs with `values` for the checked ones, from the
        same random state each time."""
        arguments = dict(self.bound.arguments)
        for (_, name, index, _), value in zip(self.inputs, values, strict=True):
            if index is None:
                arguments[name] = value
            else:
                items = list(arguments[name])
                items[index] = value
                arguments[name] = type(self.bound.arguments[name])(items)
        call = inspect.BoundArguments(self.bound.signature, arguments)
        with _same_random_numbers(seed):
            return fn(*call.args, **call.kwargs)

    def closure(self, values: Sequence[Any], seed: int) -> tuple[Any, Any]:
        """(result, backward) of the closure's forward on `values`."""
        result, self.backward, flat = _split(self.call(self.fn, values, seed))
        if flat and self.listed is None:  # `return a, b, backward`, source unread
            self.listed = len(result)
        return result, self.backward

    def cotangents(
        self, result: Any, weights: list[torch.Tensor | None], backward: Any
    ) -> list[Any]:
        """The arguments of `backward` for output gradients `weights`."""
        return _cotangents(result, weights, backward, self.listed)

    def unfit(self, seed: int) -> str | None:
        """Where backward takes fewer gradients than there are outputs: which outputs
        take them (`taken`), and a report where their count is not backward's."""
        if not self.inputs:
            return None  # nothing is differentiated: backward never runs
        with torch.no_grad():
            result, backward = self.closure([t for *_, t in self.inputs], seed)
        if not _fewer(result, backward, self.listed):
            return None
        self.taken = _taken(result)
        wants = _positional(backward)
        if len(self.taken) == wants:
            return None
        fn = self.fn
        code = getattr(backward, "__code__", None)
        line = getattr(code, "co_firstlineno", fn.__code__.co_firstlineno)
        text = linecache.getline(inspect.getsourcefile(fn) or "", line).strip()
        shown = ", ".join(str(i) for i in self.taken) or "none"
        return (
            f"`{fn.__name__}` ({_file(fn)}:{fn.__code__.co_firstlineno}): its backward "
            f"takes {wants} gradient{'s' if wants != 1 else ''}, one per "
            f"floating-point output in order, but {len(self.taken)} of its "
            f"{len(result)} outputs are floating-point or complex tensors for these "
            f"inputs (outputs: {shown}), so no gradient was checked; the op s2sgrad "
            "generates raises a RuntimeError when its backward runs\n"
            f"  backward: {_file(fn)}:{line}" + (f" (`{text}`)" if text else "") + "\n"
            "  give backward one gradient parameter per output, or return only "
            "integer or bool tensors beside the outputs it takes gradients for"
        )

    # -- first order: the user's backward ----------------------------------------------

    def check_backward(self, seed: int) -> list[Mismatch]:
        leaves = self.leaves()
        if not leaves:
            return []
        result, backward = self.closure(leaves, seed)
        outputs = _tensors(result)
        weights = _weights(outputs, seed)
        if self.taken is not None:  # only the outputs backward takes are weighted
            weights = [
                w if t else None for w, t in zip(weights, _top(result), strict=True)
            ]
        expected = _grad(outputs, weights, leaves, create_graph=False)
        with torch.no_grad():
            returned = backward(*self.cotangents(result, weights, backward))
        got = self.per_leaf(returned)
        found = []
        for label, want, leaf in zip(self.labels, expected, leaves, strict=True):
            found += self._compare(
                label, got.get(label), want, leaf, 1, "your backward"
            )
        return found

    def per_leaf(self, returned: Any) -> dict[str, Any]:
        """The gradient `backward` returned for each leaf name (None: none given),
        read as the generated op reads it: one entry per parameter, a list parameter's
        entry any iterable of gradients; a lone list parameter's gradients may come
        bare or in a 1-tuple."""
        listed = {
            name for name, value in self.bound.arguments.items() if _listed(value)
        }
        if len(self.names) == 1 and self.names[0] in listed:
            bare = isinstance(returned, tuple) and len(returned) == 1
            if bare and not isinstance(returned[0], torch.Tensor):
                returned = returned[0]
            entries: tuple[Any, ...] = (returned,)
        elif isinstance(returned, tuple) or (
            isinstance(returned, list) and len(self.names) > 1
        ):
            entries = tuple(returned)
        else:
            entries = (returned,)
        by_name: dict[str, Any] = {}
        for name, entry in zip(self.names, entries, strict=False):
            if name in listed and entry is not None:
                for i, item in enumerate(entry):
                    by_name[f"{name}[{i}]"] = item
            else:
                by_name[name] = entry
        return by_name

    # -- every order: the generated op ---------------------------------------------------

    def reference(self, leaves: Sequence[torch.Tensor], seed: int) -> Any:
        """The oracle's result on `leaves`: the closure's forward, through which
        torch.autograd differentiates; or, for a surrogate, `_Surrogate`."""
        if self.surrogate:
            return _Surrogate.apply(self, seed, *leaves)  # type: ignore[no-untyped-call]
        return self.closure(leaves, seed)[0]

    def check_op(self, op: Callable[..., Any], order: int, seed: int) -> list[Mismatch]:
        """The op's integer and bool outputs against the closure's, then its
        gradients against the oracle's at orders 1 to `order`, alone and mixed,
        stopping at the first wrong one; then the op's forward mode."""
        leaves = self.leaves()
        returned = self.call(op, leaves, seed)
        found = self.check_values(returned, seed)
        if found:
            return found
        mine, weights = _reverse(_tensors(returned), leaves, order, seed)
        theirs_at = self.leaves()
        result = self.reference(theirs_at, seed)
        theirs, _ = _reverse(_tensors(result), theirs_at, order, seed)
        for (k, kind, got), (_, _, want) in zip(mine, theirs, strict=True):
            found = []
            for label, g, w, leaf in zip(self.labels, got, want, leaves, strict=True):
                found += self._compare(label, g, w, leaf, k, "the generated op", kind)
            if found:
                return found
        pure = [grads for _, kind, grads in mine if kind == "alone"]
        return self.check_forward(op, pure, weights, seed)

    def check_values(self, returned: Any, seed: int) -> list[Mismatch]:
        """The op's outputs that have no gradient (integer and bool tensors, numbers)
        against the closure forward's, for equal values: the floating-point ones are
        checked through their gradients."""
        with torch.no_grad():
            result = self.closure([t for *_, t in self.inputs], seed)[0]
        mine, theirs = _outputs(returned), _outputs(result)
        what = "the generated op"
        if len(mine) != len(theirs):
            count = f"{len(mine)} outputs, expected {len(theirs)}"
            return [_value("its outputs", what, count)]
        found = []
        for (label, got), (_, want) in zip(mine, theirs, strict=True):
            detail = _differs(got, want)
            if detail is not None:
                found.append(_value(label, what, detail))
        return found

    def check_forward(
        self,
        op: Callable[..., Any],
        pure: list[list[torch.Tensor]],
        weights: list[list[torch.Tensor | None]],
        seed: int,
    ) -> list[Mismatch]:
        """The op's forward mode against its reverse mode (checked by now), the
        dot-product test: at order k, `sum(u * jvp(t))` of the order k-1 gradients
        (the outputs at k = 1) equals `sum(grad_k * t)`, with `u` the weights that
        made `grad_k`, for a tangent `t` in every input; where it does not, in one
        input at a time, to say which."""
        values = tuple(t.detach() for *_, t in self.inputs)
        if not values or any(v.is_complex() for v in values):
            return []  # forward mode is checked for real inputs only
        generator = torch.Generator().manual_seed(seed + _TANGENTS)
        tangents = [
            torch.randn(v.shape, generator=generator, dtype=v.dtype) for v in values
        ]
        read = [w is not None for w in weights[0]]

        def level(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            outputs = _tensors(self.call(op, xs, seed))
            return tuple(o for o, r in zip(outputs, read, strict=True) if r)

        def test(
            k: int,
            u: tuple[torch.Tensor, ...],
            grads: list[torch.Tensor],
            i: int | None,
        ) -> list[Mismatch]:
            inputs = range(len(values)) if i is None else [i]
            along = tuple(
                t if j in inputs else torch.zeros_like(t)
                for j, t in enumerate(tangents)
            )
            moved = torch.func.jvp(level, values, along)[1]
            label = ", ".join(self.labels[j] for j in inputs)
            pairs = [(grads[j].detach(), tangents[j]) for j in inputs]
            return _dot(label, k, u, moved, pairs)

        for k, (grads, used) in enumerate(zip(pure, weights, strict=True), start=1):
            u = tuple(w for w in used if w is not None)
            found = test(k, u, grads, None)
            if found:
                alone = [m for i in range(len(values)) for m in test(k, u, grads, i)]
                return alone or found
            level = _pulled(level, u)
        return []

    # -- comparing and reporting -------------------------------------------------------

    def _compare(
        self,
        name: str,
        got: Any,
        want: torch.Tensor,
        leaf: torch.Tensor,
        order: int,
        what: str,
        kind: str = "alone",
    ) -> list[Mismatch]:
        where = self.source.at(self._position(name), self.backward)
        shape = tuple(want.shape)
        want = want.detach()
        if got is None:
            if not want.numel() or bool(want.abs().max() == 0):
                return []
            return [Mismatch(name, order, what, 0.0, None, None, shape, where, kind)]
        got = torch.as_tensor(got).detach()
        if tuple(got.shape) != shape:
            try:  # as torch.autograd takes a gradient: summed to the input's shape
                got = got.sum_to_size(shape)
            except RuntimeError:
                returned = tuple(got.shape)
                return [
                    Mismatch(name, order, what, 0.0, None, returned, shape, where, kind)
                ]
        figures = _errors(got, want, leaf.dtype)
        if figures is None:
            return []
        max_abs, max_rel, scale = figures
        return [
            Mismatch(
                name, order, what, max_abs, max_rel, shape, shape, where, kind, scale
            )
        ]

    def _position(self, name: str) -> int:
        return self.names.index(name.split("[")[0])

    def oracle(self) -> str:
        if self.surrogate:
            return (
                f"the derivative your backward defines ({_SURROGATE}), at every order"
            )
        return "torch.autograd through the closure's own forward"

    def report(self, found: list[Mismatch]) -> str:
        fn = self.fn
        where = f"{_file(fn)}:{fn.__code__.co_firstlineno}"
        first = found[0]
        if first.kind == "value":
            return "\n".join(
                [
                    f"`{fn.__name__}` ({where}): wrong output values, {first.what} "
                    "against the closure's own forward:",
                    *(m.describe() for m in found),
                    "  the op returns what the closure's forward computes; its "
                    "integer and bool outputs should be equal to it: a bug in "
                    "s2sgrad, please report it",
                ]
            )
        lines = [
            f"`{fn.__name__}` ({where}): wrong gradient at {first.heading()}, "
            f"{first.what} against {self.oracle()}:",
            *(m.describe() for m in found),
        ]
        if first.kind == "mixed":
            lines.append(
                "  each order alone is right; the op adds the output's gradient and "
                "its gradients' gradients wrongly when one backward gets both: a bug "
                "in s2sgrad, please report it"
            )
        elif first.kind == "forward" and self.surrogate:
            lines.append(
                "  reverse mode is right at every order; the op's forward mode "
                "(torch.func.jvp, jacfwd, hessian) disagrees with it. For a surrogate, "
                "forward mode is the transpose of your backward, which is a derivative "
                "only where backward is linear in its incoming gradient: is it (a "
                "clamp or a norm of the gradient is not)?"
            )
        elif first.kind == "forward":
            lines.append(
                "  reverse mode is right at every order; the op's forward mode "
                "(torch.func.jvp, jacfwd, hessian) disagrees with it"
            )
        elif first.what == "the generated op" and first.order > 1 and self.surrogate:
            lines.append(
                "  the op is right at first order; at this order it differs from your "
                "backward's own derivative (through the values it reads): a bug in "
                "s2sgrad, please report it"
            )
        elif first.what == "the generated op" and first.order > 1:
            lines.append(
                "  your backward is right at first order; its own derivative is not "
                "(does it detach a value, read `.data`, or leave torch?)"
            )
        return "\n".join(lines)

    def summary(self, order: int) -> str:
        """What a check that found nothing wrong checked."""
        orders = "order 1" if order == 1 else f"orders 1 to {order}"
        if order > 1:
            orders += " (each alone and mixed with the output)"
        checked = ", ".join(f"`{label}`" for label in self.labels) or "none"
        taken = ""
        if self.taken is not None:
            shown = ", ".join(str(i) for i in self.taken)
            taken = (
                f"; backward takes the gradient{'s' if len(self.taken) > 1 else ''} "
                f"of output{'s' if len(self.taken) > 1 else ''} {shown} only, the "
                "others' values were compared"
            )
        return (
            f"`{self.fn.__name__}`: right at {orders}, in reverse and forward mode, "
            f"against {self.oracle()}; inputs checked: {checked}{taken}"
        )


class _Surrogate(torch.autograd.Function):
    """The derivative a closure's backward defines, at every order: forward runs the
    closure's forward; backward runs it again from the saved inputs with grad on and
    calls its `backward` on the incoming gradients, so that the next order is
    backward's own derivative, through the temporaries it reads."""

    @staticmethod
    def forward(
        ctx: Any, rule: _Rule, seed: int, *values: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.rule, ctx.seed, ctx.count = rule, seed, len(values)
        outputs = tuple(_tensors(rule.closure(values, seed)[0]))
        ctx.save_for_backward(*values, *outputs)
        ctx.mark_non_differentiable(*(o for o in outputs if not _differentiable(o)))
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        rule: _Rule = ctx.rule
        values = ctx.saved_tensors[: ctx.count]
        with torch.enable_grad():
            result, backward = rule.closure(values, ctx.seed)
            _read_own_outputs(
                backward, _tensors(result), ctx.saved_tensors[ctx.count :]
            )
            weights = [
                g if _differentiable(o) else None
                for o, g in zip(_tensors(result), grads, strict=True)
            ]
            returned = rule.per_leaf(
                backward(*rule.cotangents(result, weights, backward))
            )
        found = [
            _summed(returned.get(label), v)
            for label, v in zip(rule.labels, values, strict=True)
        ]
        return None, None, *found


def _read_own_outputs(
    backward: Callable[..., Any],
    recomputed: list[torch.Tensor],
    outputs: Sequence[torch.Tensor],
) -> None:
    """Point `backward`'s captures of the recomputed outputs at this Function's own, as
    the generated op's backward reads its outputs: their derivative at the next order
    is then the one backward defines, where a temporary's is forward's."""
    own = {id(r): o for r, o in zip(recomputed, outputs, strict=True)}
    for cell in getattr(backward, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a name forward had not bound yet
            continue
        if id(value) in own:
            cell.cell_contents = own[id(value)]


def _checked_inputs(
    arguments: dict[str, Any],
) -> list[tuple[str, str, int | None, torch.Tensor]]:
    """The tensors among `arguments` (and in their lists) that require grad, as
    `torch.autograd.gradcheck` chooses; where none does, every floating-point one."""
    found: list[tuple[str, str, int | None, torch.Tensor]] = []
    for name, value in arguments.items():
        if _listed(value):
            found += [
                (f"{name}[{i}]", name, i, v)
                for i, v in enumerate(value)
                if isinstance(v, torch.Tensor)
            ]
        elif isinstance(value, torch.Tensor):
            found.append((name, name, None, value))
    marked = [c for c in found if c[3].requires_grad]
    return marked or [c for c in found if _differentiable(c[3])]


def _errors(
    got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype
) -> tuple[float, float | None, float | None] | None:
    """(max abs error, max rel error, largest expected magnitude) where `got` is not
    `want` at the tolerances of `dtype`, else None. The relative error is taken only
    where something else than 0 is expected (None where nothing else is), and the
    magnitude given only where some wrong entry expects 0: against 0, the absolute
    error and the gradient's scale are what a reader can weigh."""
    if not want.numel():
        return None
    rtol, atol = _TOLERANCES.get(dtype, _LOW_PRECISION)
    got = got.to(want.dtype)
    largest = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max())
    error = (got - want).abs()
    # A NaN where a number is expected is wrong (NaN compares false with any
    # tolerance); the same infinity is not. Where the reference itself is NaN (the
    # `torch.where` of a safe sqrt: 0 * inf through the branch not taken) it says
    # nothing, and a rule that gives the number there is not judged by it.
    same = (got == want) | want.isnan()
    wrong = ~same & ~(error <= atol * (1.0 + largest) + rtol * want.abs())
    if not bool(wrong.any()):
        return None
    nonzero = wrong & (want != 0)
    relative = error[nonzero] / want.abs()[nonzero]
    zero = bool((wrong & (want == 0)).any())
    return (
        float(error.max()),
        float(relative.max()) if relative.numel() else None,
        largest if zero else None,
    )


def _listed(value: Any) -> bool:
    """Whether a parameter's value is a list (or tuple) of tensors."""
    return isinstance(value, (list, tuple)) and any(
        isinstance(v, torch.Tensor) for v in value
    )


def _summed(grad: Any, value: torch.Tensor) -> Any:
    """A gradient summed to its input's shape, as torch.autograd takes one."""
    if isinstance(grad, torch.Tensor) and grad.shape != value.shape:
        return grad.sum_to_size(value.shape)
    return grad


def _dot(
    label: str,
    order: int,
    u: Sequence[torch.Tensor],
    moved: Sequence[torch.Tensor],
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
) -> list[Mismatch]:
    """The dot-product test of forward mode: `sum(u * jvp(t)) == sum(grad * t)` over
    (grad, t) `pairs`, at a tolerance scaled by the magnitudes of the terms summed."""
    jvp_terms = [(w * m).flatten() for w, m in zip(u, moved, strict=True)]
    vjp_terms = [(g * t).flatten() for g, t in pairs]
    jvp = float(sum(x.sum() for x in jvp_terms))
    vjp = float(sum(x.sum() for x in vjp_terms))
    scale = float(sum(x.abs().sum() for x in [*jvp_terms, *vjp_terms]))
    rtol, atol = _TOLERANCES.get(pairs[0][1].dtype, _LOW_PRECISION)
    error = abs(jvp - vjp)
    if error <= atol * (1.0 + scale) + rtol * abs(vjp):
        return []
    what = "the generated op"
    return [
        Mismatch(
            label, order, what, error, None, (), (), "", "forward", None, (jvp, vjp)
        )
    ]


def _pulled(
    level: Callable[..., tuple[torch.Tensor, ...]], u: tuple[torch.Tensor, ...]
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The next level of gradients as a function of the inputs: `level`'s
    vector-Jacobian product with `u` (torch.func, so that jvp can go through it)."""

    def pulled(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        vjp = torch.func.vjp(level, *xs)[1]
        return tuple(vjp(u))

    return pulled


class _Source:
    """What the checker reads in the closure's source (libcst positions): its pragmas,
    and where its `backward` returns each gradient."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.path = _file(fn)
        #: per closure in `fn` (by its `def` line): (line, line of each element) of
        #: each of its `return` statements
        self.returns: dict[int, list[tuple[int, list[int]]]] = {}
        #: `# s2sgrad: key=value` in `fn`; a misspelt one raises TransformError
        self.pragmas: dict[str, str] = {}
        #: how many outputs `fn`'s final `return` lists (`return a, b, backward`,
        #: `return (a, b), backward`); None for one expression (`return out,
        #: backward`), which may be a list output, or where the source is not read
        self.outputs: int | None = None
        try:
            source = "".join(linecache.getlines(inspect.getsourcefile(fn) or ""))
            wrapper = MetadataWrapper(cst.parse_module(source))
        except (TypeError, OSError, cst.ParserSyntaxError):
            return
        positions = wrapper.resolve(PositionProvider)
        outer = [
            node
            for node in positions
            if isinstance(node, cst.FunctionDef)
            and node.name.value == fn.__name__
            and _def_line(node, positions) == fn.__code__.co_firstlineno
        ]
        if not outer:
            return
        self.pragmas = read_pragmas(outer[0], Locator(self.path, source, positions))
        pair = returned_pair(outer[0])
        if pair is not None and isinstance(pair[0], cst.Tuple):
            self.outputs = len(pair[0].elements)
        for backward in _backward_defs(outer[0]):
            spots = self.returns.setdefault(_def_line(backward, positions), [])
            for ret in _returns(backward):
                if ret.value is None:
                    continue
                items = (
                    [e.value for e in ret.value.elements]
                    if isinstance(ret.value, cst.Tuple)
                    else [ret.value]
                )
                spots.append(
                    (
                        positions[ret].start.line,
                        [positions[e].start.line for e in items],
                    )
                )

    def at(self, position: int, backward: Callable[..., Any] | None) -> str:
        """Where `backward` returns the gradient of parameter number `position`."""
        line = getattr(getattr(backward, "__code__", None), "co_firstlineno", 0)
        returns = self.returns.get(line) or [
            r for rs in self.returns.values() for r in rs
        ]
        if not returns:
            return "backward (its source is not available)"
        spots = []
        for line, elements in returns:
            at = elements[position] if position < len(elements) else line
            text = linecache.getline(inspect.getsourcefile(self.fn) or "", line).strip()
            spots.append(f"{self.path}:{at} (`{text}`)")
        return ", or ".join(spots)


@contextlib.contextmanager
def _same_random_numbers(seed: int) -> Iterator[None]:
    """Run a forward from the same random state each time, and leave the caller's
    state as it was: a forward that draws random numbers (dropout's mask) then draws
    the same ones in the op as in the closure."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


def _backward_defs(outer: cst.FunctionDef) -> list[cst.FunctionDef]:
    """The functions defined directly in `outer`'s body (its backward closures)."""
    found: list[cst.FunctionDef] = []

    class Visit(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            if node is not outer:
                found.append(node)
                return False
            return True

    outer.visit(Visit())
    return found


def _def_line(function: cst.FunctionDef, positions: Any) -> int:
    """The line Python gives as the function's first (its first decorator's)."""
    if function.decorators:
        return int(positions[function.decorators[0]].start.line)
    return int(positions[function].start.line)


def _returns(function: cst.FunctionDef) -> list[cst.Return]:
    """The `return` statements of `function`, not of functions inside it."""
    found: list[cst.Return] = []

    class Visit(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    function.visit(Visit())
    return found


# -- the generated op -----------------------------------------------------------------

_GENERATED: dict[tuple[str, str, str], dict[str, Any]] = {}


def generated_op(
    fn: Callable[..., Any], options: Options | None = None
) -> Callable[..., Any]:
    """The op s2sgrad generates from `fn`: its module converted in memory (cached by
    its text), its helpers imported from the module `fn` lives in."""
    from s2sgrad import transform

    path = inspect.getsourcefile(fn)
    if path is None:
        raise TypeError(f"`{fn.__name__}`: its source file is not available")
    source = "".join(linecache.getlines(path))
    options = options or Options()
    key = (path, hashlib.sha256(source.encode()).hexdigest(), options.key())
    if key not in _GENERATED:
        module = fn.__module__
        name = module if module in sys.modules else None
        text = transform(source, _file(fn), name, **dataclasses.asdict(options))
        listing = f"<s2sgrad {_file(fn)}>"
        linecache.cache[listing] = (len(text), None, text.splitlines(True), listing)
        namespace: dict[str, Any] = {"__name__": f"{module}_grad"}
        exec(compile(text, listing, "exec"), namespace)  # noqa: S102
        _GENERATED[key] = namespace
    op = _GENERATED[key].get(fn.__name__)
    if not callable(op):
        raise TypeError(f"`{fn.__name__}` is not a differentiator s2sgrad converts")
    return op  # type: ignore[no-any-return]


# -- helpers --------------------------------------------------------------------------


def _file(fn: Callable[..., Any]) -> str:
    """Where `fn` is written, as `s2sgrad` shows paths."""
    path = fn.__code__.co_filename
    return display_path(Path(path)) if Path(path).is_file() else path


def _differentiable(value: torch.Tensor) -> bool:
    return value.is_floating_point() or value.is_complex()


def _split(returned: Any) -> tuple[Any, Callable[..., Any], bool]:
    """(result, backward, whether the outputs came flat) of `return result, backward`
    or `return a, b, backward`."""
    if (
        not isinstance(returned, tuple)
        or len(returned) < 2
        or not callable(returned[-1])
    ):
        raise TypeError("a closure-style function returns its result and `backward`")
    *outs, backward = returned
    if len(outs) == 1:
        return outs[0], backward, False
    return tuple(outs), backward, True


def _tensors(result: Any) -> list[torch.Tensor]:
    if isinstance(result, (list, tuple)):
        return [t for item in result for t in _tensors(item)]
    return [result] if isinstance(result, torch.Tensor) else []


def _weights(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(o.shape, generator=generator, dtype=o.dtype)
            if _differentiable(o)
            else None
        )
        for o in outputs
    ]


def _cotangents(
    result: Any,
    weights: list[torch.Tensor | None],
    backward: Callable[..., Any],
    listed: int | None,
) -> list[Any]:
    """The arguments of `backward`: one gradient per output, a list for a list; or,
    where backward takes fewer than the `listed` outputs, the gradients of the
    floating-point tensor outputs in order (`_taken`)."""
    it = iter(weights)
    if isinstance(result, torch.Tensor):
        return [next(it)]
    parameters = inspect.signature(backward).parameters.values()
    flat = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if listed is None and len(parameters) == 1 and not flat:  # a list output
        return [[next(it) for _ in result]]
    items = [[next(it) for _ in _tensors(o)] for o in result]
    if _fewer(result, backward, listed):
        taken = [items[i][0] for i in _taken(result)]
        if len(taken) != _positional(backward):  # `_Rule.unfit` reports it first
            raise TypeError(
                f"backward takes {_positional(backward)} gradients for "
                f"{len(taken)} floating-point outputs"
            )
        return taken
    return [
        g[0] if isinstance(o, torch.Tensor) else g
        for o, g in zip(result, items, strict=True)
    ]


def _positional(backward: Callable[..., Any]) -> int:
    """How many gradients `backward` takes: its positional parameters."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    parameters = inspect.signature(backward).parameters.values()
    return sum(1 for p in parameters if p.kind in kinds)


def _fewer(result: Any, backward: Callable[..., Any], listed: int | None) -> bool:
    """Whether `backward` takes fewer gradients than the closure's `return` lists
    outputs (`return values, indices, backward` with `def backward(grad_output)`)."""
    if listed is None or not isinstance(result, tuple):
        return False
    parameters = inspect.signature(backward).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return False
    return _positional(backward) < len(result)


def _taken(result: tuple[Any, ...]) -> list[int]:
    """The outputs a backward with fewer gradients than outputs takes them for: the
    floating-point (or complex) tensors, in order, as the op's `_floating_grads`."""
    return [
        i
        for i, o in enumerate(result)
        if isinstance(o, torch.Tensor) and _differentiable(o)
    ]


def _top(result: Any) -> list[bool]:
    """For each of `_tensors(result)`: whether it is an output itself, not an element
    of a list output."""
    if isinstance(result, torch.Tensor):
        return [True]
    found: list[bool] = []
    for o in result if isinstance(result, (list, tuple)) else ():
        found += [True] if isinstance(o, torch.Tensor) else [False] * len(_tensors(o))
    return found


def _outputs(result: Any, label: str = "") -> list[tuple[str, Any]]:
    """(label, value) of each output, a list's elements each: `output 1`,
    `output 2[0]`; `the output` where there is one."""
    if isinstance(result, (list, tuple)):
        found = []
        for i, item in enumerate(result):
            found += _outputs(item, f"{label}[{i}]" if label else f"output {i}")
        return found
    return [(label or "the output", result)]


def _differs(got: Any, want: Any) -> str | None:
    """How an output without a gradient (an integer or bool tensor, a number) differs
    from the closure's, else None."""
    if isinstance(want, torch.Tensor):
        if _differentiable(want):
            return None  # checked through its gradients
        if not isinstance(got, torch.Tensor):
            return f"{type(got).__name__}, expected a {want.dtype} tensor"
        if got.dtype != want.dtype:
            return f"dtype {got.dtype}, expected {want.dtype}"
        if got.shape != want.shape:
            return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if torch.equal(got, want):
            return None
        wrong = int((got != want).sum())
        return (
            f"{wrong} of its {want.numel()} values differ from the closure's "
            f"({want.dtype}, shape {tuple(want.shape)})"
        )
    if isinstance(want, (bool, int)) and not (type(got) is type(want) and got == want):
        return f"{got!r}, expected {want!r}"
    return None


def _value(label: str, what: str, detail: str) -> Mismatch:
    return Mismatch(label, 0, what, 0.0, None, None, (), "", "value", detail=detail)


def _grad(
    outputs: list[torch.Tensor],
    weights: Sequence[torch.Tensor | None],
    leaves: list[torch.Tensor],
    create_graph: bool,
) -> list[torch.Tensor]:
    pairs = [
        (o, w)
        for o, w in zip(outputs, weights, strict=True)
        if w is not None and o.requires_grad
    ]
    if not pairs or not leaves:
        return [torch.zeros_like(t) for t in leaves]
    found = torch.autograd.grad(
        [o for o, _ in pairs],
        leaves,
        [w for _, w in pairs],
        create_graph=create_graph,
        retain_graph=True,  # the pure and the mixed chain differentiate one graph
        allow_unused=True,
        materialize_grads=True,
    )
    return list(found)


def _reverse(
    outputs: list[torch.Tensor], leaves: list[torch.Tensor], order: int, seed: int
) -> tuple[list[tuple[int, str, list[torch.Tensor]]], list[list[torch.Tensor | None]]]:
    """Gradients of orders 1..order in both shapes, (order, "alone" or "mixed",
    gradients) each, and the weights the pure chain used at each level.

    Alone, order k differentiates a random weighted sum of order k-1's gradients;
    mixed, order k differentiates one loss that keeps the output's weighted sum and
    each lower mixed order's (`sum(w * out) + sum(v1 * grad_1) + ...`), so that the
    op's backward gets its output's gradient and its gradients' gradients in one call.
    """
    weights = [_weights(outputs, seed)]
    pure = _grad(outputs, weights[0], leaves, create_graph=order > 1)
    found = [(1, "alone", pure)]
    terms = list(zip(outputs, weights[0], strict=True))  # the mixed loss so far
    mixed = pure
    for k in range(2, order + 1):
        again = k < order
        weights.append(_weights(pure, seed + k - 1))
        pure = _grad(pure, weights[-1], leaves, create_graph=again)
        terms += zip(mixed, _weights(mixed, seed + _MIXED + k), strict=True)
        mixed = _grad([t for t, _ in terms], [w for _, w in terms], leaves, again)
        found += [(k, "alone", pure), (k, "mixed", mixed)]
    return found, weights


# -- `s2sgrad check`: the differentiators of a module with example inputs ----------------

#: The module-level name that maps differentiator names to example-input factories.
EXAMPLES = "S2SGRAD_EXAMPLES"


@dataclasses.dataclass(frozen=True)
class Checked:
    """What `s2sgrad check` found for one differentiator."""

    name: str
    #: "ok" (report: a note where the op was checked against its own backward,
    #: `surrogate=true`), "wrong" (report says why), "no examples", or "error" (its
    #: example or its forward raised; report says what)
    status: str
    report: str = ""


def check_module(
    module: Any, names: Sequence[str], order: int, options: Options
) -> list[Checked]:
    """Check each differentiator in `names` (in that order) that `module`'s
    `S2SGRAD_EXAMPLES` gives example inputs for. Raise `ValueError` when that table
    is malformed or names something that is not a differentiator."""
    examples = getattr(module, EXAMPLES, {})
    if not isinstance(examples, dict) or not all(
        isinstance(k, str) and callable(v) for k, v in examples.items()
    ):
        raise ValueError(
            f"{EXAMPLES} must be a dict from differentiator names to functions that "
            "return example inputs"
        )
    unknown = sorted(set(examples) - set(names))
    if unknown:
        raise ValueError(
            f"{EXAMPLES} names `{unknown[0]}`, which is not a differentiator of this "
            f"module (they are: {', '.join(names) or 'none'})"
        )
    found = []
    for name in names:
        if name not in examples:
            found.append(Checked(name, "no examples"))
            continue
        try:
            torch.manual_seed(0)  # the same example inputs on every run
            args, kwargs = _example(examples[name]())
            outcome = _check(getattr(module, name), args, kwargs, order, 0, options)
        except Exception as exc:  # noqa: BLE001 - the user's code raised: report it
            if type(exc).__module__.startswith("s2sgrad") and not isinstance(
                exc, TransformError
            ):
                raise
            found.append(Checked(name, "error", f"{type(exc).__name__}: {exc}"))
            continue
        if outcome.wrong:
            found.append(Checked(name, "wrong", outcome.text))
        else:
            note = (
                f"against its own backward: {_SURROGATE}" if outcome.surrogate else ""
            )
            found.append(Checked(name, "ok", note))
    return found


def _example(made: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of what an example factory returned: a tuple of positional
    arguments, or a pair (that tuple, a dict of keyword arguments)."""
    if (
        isinstance(made, tuple)
        and len(made) == 2
        and isinstance(made[0], tuple)
        and isinstance(made[1], dict)
    ):
        return made[0], made[1]
    return (made if isinstance(made, tuple) else (made,)), {}
