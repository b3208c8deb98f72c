"""Per-call cost of the generated op's call path, at the tiny size where it shows.

For every sample differentiator, with every floating-point input requiring grad:

- `op`: the generated op, `samples/<module>_grad.py:<f>(...)` (its `_apply` fast path);
- `apply`: the same op with `_base_apply = None` in s2sgrad.runtime, so that `_apply` takes
  torch's public `FFunction.apply` (which binds `inspect.signature(forward)` per call);
- `math`: `f_forward(...)` under `torch.no_grad()`, the forward's own work.

`op - math` is what the wrapper adds (autograd's graph node included); `apply - op` is
what `_apply` saves. Forward only: backward's wrapper is a plain call. Timed with
`torch.utils.benchmark.Timer` on one torch thread, CPU time of the calling thread,
the three interleaved in rounds and the lowest median kept.

Run directly for a quick look: `python benchmarks/per_call.py`.
"""

from __future__ import annotations

import importlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.utils.benchmark as benchmark

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import s2sgrad.runtime  # noqa: E402
from benchmarks import cases  # noqa: E402


def _time(fn: Any, min_run_time: float) -> float:
    timer = benchmark.Timer(
        "fn()", globals={"fn": fn}, num_threads=1, timer=time.thread_time
    )
    return timer.blocked_autorange(min_run_time=min_run_time).median


def best_of(
    variants: dict[str, Any], rounds: int, min_run_time: float
) -> dict[str, float]:
    """Each variant's best median time in microseconds over `rounds` interleaved
    rounds (interleaved, so that drift on the machine touches every variant)."""
    best = {k: float("inf") for k in variants}
    for _ in range(rounds):
        for key, fn in variants.items():
            best[key] = min(best[key], _time(fn, min_run_time))
    return {k: v * 1e6 for k, v in best.items()}


def _variants(
    op: Any, forward: Any, args: list[Any], kwargs: dict[str, Any], runtime: Any
) -> dict[str, Any]:
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]

    def math() -> Any:
        with torch.no_grad():
            return forward(*plain, **kwargs)

    def public() -> Any:
        fast, runtime._base_apply = runtime._base_apply, None
        try:
            return op(*args, **kwargs)
        finally:
            runtime._base_apply = fast

    return {"op": lambda: op(*args, **kwargs), "apply": public, "math": math}


def measure(rounds: int = 3, min_run_time: float = 0.05) -> dict[str, Any]:
    torch.set_num_threads(1)
    rows = []
    for (module, name), _ in sorted(cases.FACTORIES.items()):
        args, kwargs = cases.make_inputs(module, name, "tiny")
        args = [
            (
                a.requires_grad_()
                if isinstance(a, torch.Tensor) and a.is_floating_point()
                else a
            )
            for a in args
        ]
        generated = importlib.import_module(f"samples.{module}_grad")
        op = getattr(generated, name)
        forward = getattr(generated, f"{name}_forward")
        variants = _variants(op, forward, args, kwargs, s2sgrad.runtime)
        best = best_of(variants, rounds, min_run_time)
        rows.append({"name": f"{module}.{name}", **best})
    return {
        "rows": rows,
        "median_op_overhead_us": statistics.median(r["op"] - r["math"] for r in rows),
        "median_apply_overhead_us": statistics.median(
            r["apply"] - r["math"] for r in rows
        ),
        "median_saved_us": statistics.median(r["apply"] - r["op"] for r in rows),
    }


if __name__ == "__main__":
    result = measure()
    for row in result["rows"]:
        print(
            f"{row['name']:32} op {row['op']:6.1f} µs  apply {row['apply']:6.1f} µs  "
            f"math {row['math']:6.1f} µs"
        )
    for key in ("median_op_overhead_us", "median_apply_overhead_us", "median_saved_us"):
        print(f"{key}: {result[key]:.1f}")
