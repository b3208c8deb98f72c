"""The oracle every numeric test takes: derivatives of orders 1 to k, in both shapes.

DESIGN.md section 10. The pure shape is order k+1 of `sum(v * grad_k)` alone; the mixed
shape keeps the output and every gradient so far in one loss,
`sum(w * out) + sum(v1 * grad_1) + ...` (a gradient penalty: R1, WGAN-GP), so that the
op's backward receives its output's gradient and its temporaries' gradients in one
call. A bug where two contributions meet at different shapes (a broadcast parameter
whose gradient backward returns unreduced) shows in the mixed shape only.

Both run through `torch.autograd.grad` with `create_graph=True`; the weights come from
one generator in a fixed order of shapes, so the op and the closure's own forward (the
reference) get the same ones. `closure_op` makes a hand-written closure an op of the
same kind, so that the closure itself is checked in both shapes too.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch


@dataclass(frozen=True)
class Derivatives:
    """What one function gives: its outputs and its gradients w.r.t. the inputs."""

    outputs: list[torch.Tensor]
    #: pure[k - 1]: the order-k gradients, each order of the previous one alone.
    pure: list[list[torch.Tensor]]
    #: mixed[k - 2]: the order-k gradients of the loss that keeps every earlier term.
    mixed: list[list[torch.Tensor]]

    def pairs(self, other: Derivatives) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(label, self's value, other's value) for every value both computed."""
        found = [
            (f"output {i}", a, b)
            for i, (a, b) in enumerate(zip(self.outputs, other.outputs, strict=True))
        ]
        for shape, mine, theirs, first in (
            ("pure", self.pure, other.pure, 1),
            ("mixed", self.mixed, other.mixed, 2),
        ):
            for k, (gs, hs) in enumerate(zip(mine, theirs, strict=True), start=first):
                for i, (g, h) in enumerate(zip(gs, hs, strict=True)):
                    found.append((f"{shape} order {k}, input {i}", g, h))
        return found


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The floating-point tensors of an output (tuples and lists flattened)."""
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def weighted(values: Sequence[torch.Tensor], gen: torch.Generator) -> Any:
    """sum(w * v) over `values`, each with fixed random weights drawn from `gen`."""
    total: Any = 0.0
    for v in values:
        # Drawn on the CPU, so that a GPU run weighs with the same numbers.
        w = torch.randn(v.shape, dtype=v.dtype, generator=gen).to(v.device)
        total = total + (v * w).sum()
    return total


def gradients(loss: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """d loss / d inputs, differentiable again; zeros where it does not depend on one."""
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        return [torch.zeros_like(t) for t in inputs]
    return list(
        torch.autograd.grad(
            loss, inputs, create_graph=True, allow_unused=True, materialize_grads=True
        )
    )


def derivatives(
    fn: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    orders: int = 3,
    seed: int = 1234,
    used: Sequence[int] | None = None,
    wrt: Sequence[int] | None = None,
) -> Derivatives:
    """Outputs of `fn(*inputs)` and its gradients of orders 1..`orders`, pure and mixed.

    `inputs` are leaves that require grad; `used` picks the outputs the loss reads (the
    others get no gradient), all by default (indices into the floating-point outputs,
    flattened as `tensors_in` does). `wrt` picks the inputs that every order is taken
    with respect to, all by default; the others are constants of the loss (an op that
    gives only some of its inputs a gradient is checked on those).
    """
    gen = torch.Generator().manual_seed(seed)
    outputs = tensors_in(fn(*inputs))
    read = outputs if used is None else [outputs[i] for i in used]
    targets = list(inputs) if wrt is None else [inputs[i] for i in wrt]
    loss = weighted(read, gen)
    current = gradients(loss, targets)
    pure = [current]
    for _ in range(2, orders + 1):
        current = gradients(weighted(current, gen), targets)
        pure.append(current)
    mixed: list[list[torch.Tensor]] = []
    current = pure[0]
    for _ in range(2, orders + 1):
        loss = loss + weighted(current, gen)
        current = gradients(loss, targets)
        mixed.append(current)
    return Derivatives(
        [o.detach() for o in outputs],
        [[g.detach() for g in gs] for gs in pure],
        [[g.detach() for g in gs] for gs in mixed],
    )


#: run(*tensors) -> (outputs, vjp): the closure called on `tensors` with its other
#: arguments bound; vjp takes one gradient per output (a list) and returns one gradient,
#: or None, per tensor.
ClosureRun = Callable[..., tuple[Any, Callable[[list[torch.Tensor]], Sequence[Any]]]]


def closure_op(run: ClosureRun) -> Callable[..., tuple[torch.Tensor, ...]]:
    """An op whose gradient is a hand-written closure's backward, as PyTorch uses one.

    Its first derivative is what the closure's backward returns (a gradient returned
    unreduced is summed to its input's shape by autograd, as for any Function); its
    higher ones are autograd through that backward: backward runs the closure again on
    the saved inputs, with grad mode as autograd sets it (on under `create_graph`), so
    what it returns is differentiable again. `derivatives` of this op against the
    closure's forward checks the closure itself in the pure and the mixed shape. The
    op returns the closure's outputs, which must be floating point, as a tuple.
    """

    class ClosureFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            ctx.save_for_backward(*tensors)
            outputs, _ = run(*tensors)
            # Clones: an output that is an input tensor itself would be an alias.
            return tuple(o.clone() for o in tensors_in(outputs))

        @staticmethod
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
            _, vjp = run(*ctx.saved_tensors)
            return tuple(vjp(list(grads)))

    def op(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = ClosureFunction.apply(*tensors)  # type: ignore[no-untyped-call]
        return cast(tuple[torch.Tensor, ...], outputs)

    return op


def leaves(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh leaves that require grad, with the values of `tensors`."""
    return [t.detach().clone().requires_grad_() for t in tensors]


def assert_same(
    got: Derivatives,
    expected: Derivatives,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    what: str = "",
) -> None:
    """Every output and gradient of `got` equals `expected`'s (float64 tolerances)."""
    assert len(got.outputs) == len(expected.outputs), f"{what}number of outputs"
    for label, a, b in got.pairs(expected):

        def message(m: str, label: str = label) -> str:
            return f"{what}{label}: {m}"

        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=message)


def closure_and_op(
    source: str, text: str, module: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The closure module `source` and the generated module `text`, each run as a
    module of its own (`module`, `module_grad`): their namespaces."""
    closures: dict[str, Any] = {"__name__": module}
    exec(compile(source, f"{module}.py", "exec"), closures)
    generated: dict[str, Any] = {"__name__": f"{module}_grad"}
    exec(compile(text, f"{module}_grad.py", "exec"), generated)
    return closures, generated


def function(text: str, name: str) -> str:
    """The source of one top-level function of a generated module."""
    found = re.search(rf"^def {name}\(.*?(?=^(?:def |class )|\Z)", text, re.S | re.M)
    assert found is not None, name
    return found.group(0)


def import_pair(
    folder: Path, source: str, module: str, **options: Any
) -> tuple[ModuleType, ModuleType]:
    """Write `source` as `module.py` and its conversion as `module_grad.py` in `folder`
    and import both, as a user's package would (helpers the op imports from the
    closure's module resolve)."""
    from s2sgrad import transform

    (folder / f"{module}.py").write_text(source)
    text = transform(source, f"{module}.py", module, **options)
    (folder / f"{module}_grad.py").write_text(text)
    sys.path.insert(0, str(folder))
    try:
        for name in (module, f"{module}_grad"):
            sys.modules.pop(name, None)
        return importlib.import_module(module), importlib.import_module(
            f"{module}_grad"
        )
    finally:
        sys.path.remove(str(folder))


def mypy_strict(folder: Path, filename: str, text: str) -> str:
    """Write a generated module into `folder` and type-check it as a user's project
    would (`mypy --strict`, s2sgrad.runtime found through MYPYPATH); mypy's report,
    empty when clean."""
    import os
    import subprocess

    (folder / filename).write_text(text)
    root = Path(__file__).resolve().parent.parent
    typed = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(folder / "cache"),
         str(folder / filename)],
        cwd=folder, capture_output=True, text=True,
        env={**os.environ, "MYPYPATH": str(root)},
    )  # fmt: skip
    return "" if typed.returncode == 0 else typed.stdout + typed.stderr
