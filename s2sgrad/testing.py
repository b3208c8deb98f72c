"""Check a closure-style gradient rule against torch.autograd: `check_gradients`.

The closure's forward is plain torch, so torch.autograd through it is an exact oracle:
first for the user's own backward (first order), then for the op s2sgrad generates from
the closure at every order up to `order`. Gradients are compared as weighted sums with
random weights (vector-Jacobian products), never by finite differences, at tolerances
of the inputs' dtype. A mismatch raises `AssertionError` with a report a user can act
on: the parameter, the order, the largest absolute and relative errors, the shapes, and
the line of the closure's `backward` that returns that gradient.

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


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One wrong gradient: of `parameter`, at `order`, from `what`."""

    parameter: str
    order: int
    what: str
    max_abs: float
    max_rel: float
    shape: tuple[int, ...] | None
    expected_shape: tuple[int, ...]
    returned_at: str

    def describe(self) -> str:
        if self.shape is None:
            got = "no gradient (None), expected one"
        elif self.shape != self.expected_shape:
            got = f"shape {self.shape}, expected {self.expected_shape}"
        else:
            got = (
                f"max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                f"(shape {self.shape})"
            )
        return (
            f"- gradient of `{self.parameter}`, order {self.order}, {self.what}: {got}\n"
            f"  returned by {self.returned_at}"
        )


def check_gradients(
    fn: Callable[..., Any], *args: Any, order: int = 2, seed: int = 0, **kwargs: Any
) -> None:
    """Check `fn`'s backward, then the op s2sgrad generates from `fn`, against
    torch.autograd through `fn`'s own forward; raise `AssertionError` on a mismatch.

    `fn` is the closure-style function as written (forward returning its result and a
    `backward` closure); `args` and `kwargs` are example inputs: tensors (floating-point
    ones are differentiated), lists of tensors, and plain values. Orders 2 and up check
    the generated op (its gradients of gradients), which is where a backward that is
    right once but not differentiable (`.detach()`, `.data`) shows.
    """
    report = _check(fn, args, kwargs, order, seed, Options())
    if report:
        raise AssertionError(report)


def _check(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    order: int,
    seed: int,
    options: Options,
) -> str | None:
    """The report of what is wrong with `fn`'s gradients; None when they are right."""
    if order < 1:
        raise ValueError(f"order must be at least 1, got {order}")
    rule = _Rule(fn, args, kwargs)
    found = rule.check_backward(seed)
    if not found:
        found = rule.check_op(generated_op(fn, options), order, seed)
    return rule.report(found) if found else None


class _Rule:
    """A closure-style function with example inputs."""

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> None:
        self.fn = fn
        signature = inspect.signature(fn)
        bound = signature.bind(*args, **kwargs)
        self.names = list(signature.parameters)
        self.bound = bound
        self.returns = _Returns(fn)
        self.backward: Callable[..., Any] | None = None

    # -- inputs ----------------------------------------------------------------------

    def fresh(self) -> tuple[list[Any], dict[str, Any], list[tuple[str, torch.Tensor]]]:
        """Call arguments with fresh leaves for every floating-point tensor, and those
        leaves named `x` or `xs[1]`."""
        leaves: list[tuple[str, torch.Tensor]] = []

        def leaf(name: str, value: Any) -> Any:
            if isinstance(value, torch.Tensor) and _differentiable(value):
                copy = value.detach().clone().requires_grad_()
                leaves.append((name, copy))
                return copy
            return value

        arguments = dict(self.bound.arguments)
        for name, value in arguments.items():
            if isinstance(value, (list, tuple)) and any(
                isinstance(v, torch.Tensor) for v in value
            ):
                items = [leaf(f"{name}[{i}]", v) for i, v in enumerate(value)]
                arguments[name] = type(value)(items)
            else:
                arguments[name] = leaf(name, value)
        call = inspect.BoundArguments(self.bound.signature, arguments)
        return list(call.args), dict(call.kwargs), leaves

    # -- first order: the user's backward ----------------------------------------------

    def check_backward(self, seed: int) -> list[Mismatch]:
        args, kwargs, leaves = self.fresh()
        with _same_random_numbers(seed):
            result, backward = _split(self.fn(*args, **kwargs))
        self.backward = backward
        outputs = _tensors(result)
        weights = _weights(outputs, seed)
        expected = _grad(outputs, weights, [t for _, t in leaves], create_graph=False)
        with torch.no_grad():
            returned = backward(*_cotangents(result, weights, backward))
        got = self._per_leaf(returned)
        found = []
        for (name, tensor), want in zip(leaves, expected, strict=True):
            found += self._compare(
                name, got.get(name), want, tensor, 1, "your backward"
            )
        return found

    def _per_leaf(self, returned: Any) -> dict[str, Any]:
        """The gradient `backward` returned for each leaf name (None: none given),
        read as the generated op reads it: one entry per parameter, a list parameter's
        entry any iterable of gradients; a lone list parameter's gradients may come
        bare or in a 1-tuple."""
        listed = {
            name
            for name, value in self.bound.arguments.items()
            if isinstance(value, (list, tuple))
            and any(isinstance(v, torch.Tensor) for v in value)
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

    def check_op(self, op: Callable[..., Any], order: int, seed: int) -> list[Mismatch]:
        found: list[Mismatch] = []
        args, kwargs, leaves = self.fresh()
        with _same_random_numbers(seed):
            returned = op(*args, **kwargs)
        mine = _orders(returned, [t for _, t in leaves], order, seed)
        args, kwargs, leaves = self.fresh()
        with _same_random_numbers(seed):
            result, _ = _split(self.fn(*args, **kwargs))
        oracle = _orders(result, [t for _, t in leaves], order, seed)
        for k, (got, want) in enumerate(zip(mine, oracle, strict=True), start=1):
            for (name, tensor), g, w in zip(leaves, got, want, strict=True):
                found += self._compare(name, g, w, tensor, k, "the generated op")
            if found:
                break
        return found

    # -- comparing and reporting -------------------------------------------------------

    def _compare(
        self,
        name: str,
        got: Any,
        want: torch.Tensor,
        leaf: torch.Tensor,
        order: int,
        what: str,
    ) -> list[Mismatch]:
        where = self.returns.at(self._position(name), self.backward)
        shape = tuple(want.shape)
        if got is None:
            if bool(want.detach().abs().max() == 0) if want.numel() else True:
                return []
            return [Mismatch(name, order, what, 0.0, 0.0, None, shape, where)]
        got = torch.as_tensor(got).detach()
        if tuple(got.shape) != shape:
            try:  # as torch.autograd takes a gradient: summed to the input's shape
                got = got.sum_to_size(shape)
            except RuntimeError:
                wrong = tuple(got.shape)
                return [Mismatch(name, order, what, 0.0, 0.0, wrong, shape, where)]
        want = want.detach()
        if not want.numel():
            return []
        rtol, atol = _TOLERANCES.get(leaf.dtype, _LOW_PRECISION)
        scale = 1.0 + float(want.abs().max())
        error = (got.to(want.dtype) - want).abs()
        if bool((error <= atol * scale + rtol * want.abs()).all()):
            return []
        relative = error / want.abs().clamp_min(torch.finfo(error.dtype).tiny)
        return [
            Mismatch(
                name,
                order,
                what,
                float(error.max()),
                float(relative[error > atol * scale].max()),
                shape,
                shape,
                where,
            )
        ]

    def _position(self, name: str) -> int:
        return self.names.index(name.split("[")[0])

    def report(self, found: list[Mismatch]) -> str:
        fn = self.fn
        where = f"{_file(fn)}:{fn.__code__.co_firstlineno}"
        first = found[0]
        oracle = "torch.autograd through the closure's own forward"
        lines = [
            f"`{fn.__name__}` ({where}): wrong gradient at order {first.order}, "
            f"{first.what} against {oracle}:",
            *(m.describe() for m in found),
        ]
        if first.what == "the generated op" and first.order > 1:
            lines.append(
                "  your backward is right at first order; its own derivative is not "
                "(does it detach a value, read `.data`, or leave torch?)"
            )
        return "\n".join(lines)


class _Returns:
    """Where the closure's `backward` returns each gradient (libcst positions)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.path = _file(fn)
        #: per closure in `fn` (by its `def` line): (line, line of each element) of
        #: each of its `return` statements
        self.returns: dict[int, list[tuple[int, list[int]]]] = {}
        try:
            lines = linecache.getlines(inspect.getsourcefile(fn) or "")
            wrapper = MetadataWrapper(cst.parse_module("".join(lines)))
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


def _split(returned: Any) -> tuple[Any, Callable[..., Any]]:
    """(result, backward) of `return result, backward` or `return a, b, backward`."""
    if (
        not isinstance(returned, tuple)
        or len(returned) < 2
        or not callable(returned[-1])
    ):
        raise TypeError("a closure-style function returns its result and `backward`")
    *outs, backward = returned
    return (outs[0] if len(outs) == 1 else tuple(outs)), backward


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
    result: Any, weights: list[torch.Tensor | None], backward: Callable[..., Any]
) -> list[Any]:
    """The arguments of `backward`: one gradient per output, a list for a list."""
    it = iter(weights)
    if isinstance(result, torch.Tensor):
        return [next(it)]
    parameters = inspect.signature(backward).parameters.values()
    flat = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if len(parameters) == 1 and not flat:  # a list output
        return [[next(it) for _ in result]]
    items = [[next(it) for _ in _tensors(o)] for o in result]
    return [
        g[0] if isinstance(o, torch.Tensor) else g
        for o, g in zip(result, items, strict=True)
    ]


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
        allow_unused=True,
        materialize_grads=True,
    )
    return list(found)


def _orders(
    result: Any, leaves: list[torch.Tensor], order: int, seed: int
) -> list[list[torch.Tensor]]:
    """Gradients of orders 1..order: each order differentiates a random weighted sum
    of the previous one's gradients."""
    outputs = _tensors(result)
    found = []
    for k in range(order):
        weights = _weights(outputs, seed + k)
        grads = _grad(outputs, weights, leaves, create_graph=k + 1 < order)
        found.append(grads)
        outputs = [g for g in grads]
    return found


# -- `s2sgrad check`: the differentiators of a module with example inputs ----------------

#: The module-level name that maps differentiator names to example-input factories.
EXAMPLES = "S2SGRAD_EXAMPLES"


@dataclasses.dataclass(frozen=True)
class Checked:
    """What `s2sgrad check` found for one differentiator."""

    name: str
    #: "ok", "wrong" (report says why), "no examples", or "error" (its example or its
    #: forward raised; report says what)
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
            report = _check(getattr(module, name), args, kwargs, order, 0, options)
        except Exception as exc:  # noqa: BLE001 - the user's code raised: report it
            if type(exc).__module__.startswith("s2sgrad") and not isinstance(
                exc, TransformError
            ):
                raise
            found.append(Checked(name, "error", f"{type(exc).__name__}: {exc}"))
            continue
        found.append(Checked(name, "wrong", report) if report else Checked(name, "ok"))
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
