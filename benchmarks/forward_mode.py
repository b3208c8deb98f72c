"""What forward mode costs now that the op's jvp is the transpose of its backward.

For every sample differentiator, `torch.func.jvp` with a tangent for every
floating-point input:

- `transpose`: the generated op, whose `jvp` is the vector-Jacobian product of
  `g -> backward(g)` at `g = 0`, pulled back by the tangent (DESIGN section 10): one
  backward and one backward of it;
- `forward`: torch's forward mode through the closure's own forward statements, which
  is what the op's `jvp` ran before (and what it would cost to keep as a faster path);
- `vjp`: one reverse-mode vector-Jacobian product of the op, for scale.

Timed with `torch.utils.benchmark.Timer` on one torch thread, CPU time of the calling
thread, the variants interleaved in rounds and the lowest median kept. A closure whose
forward runs an op without a forward-mode formula has no `forward` figure.

Run directly for a quick look: `python benchmarks/forward_mode.py [size]`.
"""

from __future__ import annotations

import importlib
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import cases  # noqa: E402
from benchmarks.per_call import best_of  # noqa: E402


def _split(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[int], Any]:
    """The positions of the floating-point tensor arguments, and a caller that puts
    new values there."""
    where = [
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
    ]

    def call(fn: Any, values: tuple[torch.Tensor, ...]) -> Any:
        filled = list(args)
        for i, v in zip(where, values, strict=True):
            filled[i] = v
        return fn(*filled, **kwargs)

    return where, call


def _variants(module: str, name: str, size: str) -> dict[str, Any]:
    args, kwargs = cases.make_inputs(module, name, size)
    where, call = _split(args, kwargs)
    primals = tuple(args[i] for i in where)
    tangents = tuple(torch.randn_like(p) for p in primals)
    op = getattr(importlib.import_module(f"samples.{module}_grad"), name)
    closure = getattr(importlib.import_module(f"samples.{module}"), name)

    def first(out: Any) -> Any:
        return out[0] if isinstance(out, tuple) else out

    def transpose() -> Any:
        return torch.func.jvp(lambda *v: call(op, v), primals, tangents)

    def forward() -> Any:
        return torch.func.jvp(lambda *v: first(call(closure, v)), primals, tangents)

    out, pull = torch.func.vjp(lambda *v: call(op, v), *primals)
    cotangent = (
        tuple(torch.randn_like(o) for o in out)
        if isinstance(out, tuple)
        else torch.randn_like(out)
    )
    found = {"transpose": transpose, "vjp": lambda: pull(cotangent)}
    try:
        forward()
    except NotImplementedError:  # torch has no forward formula for an op it runs
        return found
    return {**found, "forward": forward}


def measure(
    size: str = "medium", rounds: int = 3, min_run_time: float = 0.05
) -> dict[str, Any]:
    torch.set_num_threads(1)
    rows = []
    for module, name in sorted(cases.FACTORIES):
        variants = _variants(module, name, size)
        best = best_of(variants, rounds, min_run_time)
        rows.append({"name": f"{module}.{name}", **best})
    ratios = [r["transpose"] / r["forward"] for r in rows if "forward" in r]
    return {
        "size": size,
        "rows": rows,
        "geomean_transpose_over_forward": statistics.geometric_mean(ratios),
        "max_transpose_over_forward": max(ratios),
    }


if __name__ == "__main__":
    result = measure(sys.argv[1] if len(sys.argv) > 1 else "medium")
    for row in result["rows"]:
        print(
            f"{row['name']:32} transpose {row['transpose']:9.1f} µs  "
            f"forward {row.get('forward', float('nan')):9.1f} µs  vjp {row['vjp']:9.1f} µs"
        )
    for key in ("geomean_transpose_over_forward", "max_transpose_over_forward"):
        print(f"{key}: {result[key]:.2f}")
