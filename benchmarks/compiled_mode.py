"""`compile=true` against torch.compile of the closure and against eager autograd.

For the sample ops whose forward is more than one op (`OPS`; `--all` for every one), at
the `medium` and `large` sizes of benchmarks/cases.py (float32,
one thread, median of torch.utils.benchmark's blocked_autorange):

- fwd+bwd: the op converted with `compile=true` against `torch.compile` of the
  closure's forward (fullgraph, default dynamic), each after warm-up;
- double backward (forward, gradients with create_graph, gradient of their sum): the
  same op against eager autograd through the closure (torch.compile refuses double
  backward of the closure);
- first call: seconds of the first fwd+bwd and first double backward of the op at that
  shape (inductor's one-time start-up excluded: a warm-up op compiles first), and the
  graphs dynamo captured for it.

Targets (issue 13, geomean over the ops): fwd+bwd <= 1.05x compiled eager, double
backward <= 0.7x eager. `python benchmarks/compiled_mode.py [--quick]` prints a table.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.utils.benchmark as tbench  # noqa: E402

from benchmarks import cases  # noqa: E402
from s2sgrad import transform  # noqa: E402

SIZES = ("medium", "large")
TARGET_FB, TARGET_DB = 1.05, 0.7
QUICK = [("normalization", "layer_norm")]
#: The samples whose forward is more than one op (where compiling has work to fuse), as
#: in the prototype plus the others of that kind; `--all` takes every sample.
OPS = [
    ("temporary", "add_mul"),
    ("normalization", "layer_norm"),
    ("normalization", "rms_norm"),
    ("softmax", "softmax"),
    ("softmax", "log_softmax"),
    ("attention", "attention"),
    ("attention", "causal_attention"),
    ("mlp", "mlp"),
    ("mlp", "relu_mlp"),
    ("multi_output", "mean_var"),
]


def _compiled_module(module: str) -> types.ModuleType:
    path = ROOT / "samples" / f"{module}.py"
    text = transform(
        path.read_text(), f"samples/{module}.py", f"samples.{module}", compile=True
    )
    gen = types.ModuleType(f"samples.{module}_compiled_grad")
    exec(
        compile(text, f"{module}_compiled_grad.py", "exec"), gen.__dict__
    )  # noqa: S102
    return gen


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _bind(
    fn: Any, args: list[Any], kwargs: dict[str, Any], positions: list[int], first: bool
) -> Any:
    def op(*tensors: torch.Tensor) -> Any:
        call = list(args)
        for i, t in zip(positions, tensors, strict=True):
            call[i] = t
        out = fn(*call, **kwargs)
        return out[0] if first else out

    return op


def _fb(op: Any, tensors: list[torch.Tensor], gos: tuple[torch.Tensor, ...]) -> Any:
    return torch.autograd.grad(_as_tuple(op(*tensors)), tensors, gos, allow_unused=True)


def _db(op: Any, tensors: list[torch.Tensor], gos: tuple[torch.Tensor, ...]) -> Any:
    grads = torch.autograd.grad(
        _as_tuple(op(*tensors)), tensors, gos, create_graph=True, allow_unused=True
    )
    sums = [g.sum() for g in grads if g is not None and g.requires_grad]
    return torch.autograd.grad(sum(sums), tensors, allow_unused=True) if sums else grads


def _median(fn: Any) -> float:
    timer = tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return float(timer.blocked_autorange(min_run_time=0.4).median)


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def measure_one(
    module: str, name: str, size: str, gen: types.ModuleType
) -> dict[str, Any]:
    # Every baseline compiles the same `_bind` closure: a fresh dynamo per case keeps
    # them from sharing one recompile limit (the op's own graphs are compiled anew).
    torch._dynamo.reset()
    args, kwargs = cases.make_inputs(module, name, size)
    positions = [
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
    ]
    tensors = [args[i].requires_grad_() for i in positions]
    closure = getattr(importlib.import_module(f"samples.{module}"), name)
    eager = _bind(closure, list(args), kwargs, positions, first=True)
    ours = _bind(getattr(gen, name), list(args), kwargs, positions, first=False)
    torch.manual_seed(1)
    with torch.no_grad():
        gos = tuple(torch.randn_like(o) for o in _as_tuple(eager(*tensors)))
    compiled_eager = torch.compile(eager, fullgraph=True)
    before = _graphs()
    started = time.perf_counter()
    _fb(ours, tensors, gos)
    first_fb = time.perf_counter() - started
    started = time.perf_counter()
    _db(ours, tensors, gos)
    first_db = time.perf_counter() - started
    graphs = _graphs() - before
    _fb(compiled_eager, tensors, gos)  # compile before timing
    times = {
        "fb_ours": _median(lambda: _fb(ours, tensors, gos)),
        "fb_compiled_eager": _median(lambda: _fb(compiled_eager, tensors, gos)),
        "db_ours": _median(lambda: _db(ours, tensors, gos)),
        "db_eager": _median(lambda: _db(eager, tensors, gos)),
    }
    return {
        "op": f"{module}.{name}",
        "size": size,
        **times,
        "fb_ratio": times["fb_ours"] / times["fb_compiled_eager"],
        "db_ratio": times["db_ours"] / times["db_eager"],
        "first_fb_s": first_fb,
        "first_db_s": first_db,
        "graphs": graphs,
    }


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def measure(
    quick: bool = False, log: Any = print, every: bool = False
) -> dict[str, Any]:
    torch.set_num_threads(1)
    ops = QUICK if quick else list(cases.FACTORIES) if every else OPS
    sizes = SIZES[:1] if quick else SIZES
    started = time.perf_counter()
    warm = _compiled_module("temporary")  # inductor's one-time start-up, not per op
    x = torch.randn(4, requires_grad=True)
    warm.add_mul(x, x).sum().backward()
    startup = time.perf_counter() - started
    modules: dict[str, types.ModuleType] = {}
    rows = []
    for module, name in ops:
        if module not in modules:
            modules[module] = _compiled_module(module)
        for size in sizes:
            log(f"compiled mode: {module}.{name} {size}")
            rows.append(measure_one(module, name, size, modules[module]))
    return {
        "rows": rows,
        "startup_s": startup,
        "geomean_fb": geomean([r["fb_ratio"] for r in rows]),
        "geomean_db": geomean([r["db_ratio"] for r in rows]),
        "target_fb": TARGET_FB,
        "target_db": TARGET_DB,
    }


def markdown(result: dict[str, Any]) -> list[str]:
    lines = [
        "| op | size | fwd+bwd: ours / compiled eager | double backward: ours / eager "
        "| first fwd+bwd s | first double backward s | graphs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| `{r['op']}` | {r['size']} | {r['fb_ours'] * 1e3:.2f} / "
            f"{r['fb_compiled_eager'] * 1e3:.2f} ms = **{r['fb_ratio']:.2f}** | "
            f"{r['db_ours'] * 1e3:.2f} / {r['db_eager'] * 1e3:.2f} ms = "
            f"**{r['db_ratio']:.2f}** | {r['first_fb_s']:.1f} | {r['first_db_s']:.1f} | "
            f"{r['graphs']} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one op at one size")
    parser.add_argument("--all", action="store_true", help="every sample op")
    args = parser.parse_args(argv)
    result = measure(args.quick, lambda m: print(m, file=sys.stderr), args.all)
    print("\n".join(markdown(result)))
    print(
        f"\ngeomean fwd+bwd {result['geomean_fb']:.2f} (target <= {TARGET_FB}), "
        f"double backward {result['geomean_db']:.2f} (target <= {TARGET_DB}); "
        f"inductor start-up {result['startup_s']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
