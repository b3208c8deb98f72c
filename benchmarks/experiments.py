"""Side experiments behind the explanations in benchmarks/notes.md.

    python benchmarks/experiments.py apply       # per-call cost of autograd.Function styles
    python benchmarks/experiments.py promoted    # per-call cost of the generated wrapper
    python benchmarks/experiments.py compile     # torch.compile: promoted outputs vs none
    python benchmarks/experiments.py all

They measure variants of the generated code that s2sgrad does not emit (written here, not
in samples/), to size what a change in the generator would gain. Same method as run.py:
one thread, `time.thread_time`, blocked_autorange medians, interleaved rounds, the
lowest median kept.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.run import build_case, measure, step_fb  # noqa: E402

ROUNDS = 15


def best(
    fns: dict[str, Callable[[], Any]], rounds: int = ROUNDS, min_run_time: float = 0.05
) -> dict[str, float]:
    times: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = measure(fn, 1, min_run_time, "cpu")
            times[name] = min(t, times.get(name, float("inf")))
    return times


# --------------------------------------------------------------------------- apply


class Classic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        ctx.set_materialize_grads(False)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b, g * a


class NewStyle(torch.autograd.Function):
    """forward + setup_context, as s2sgrad generates (and DESIGN.md section 4 requires)."""

    @staticmethod
    def forward(a, b):
        return a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b, g * a


class NewStyleSignature(NewStyle):
    """The same, with `forward.__signature__` precomputed once."""

    @staticmethod
    def forward(a, b):
        return a * b


NewStyleSignature.forward.__signature__ = inspect.signature(NewStyleSignature.forward)  # type: ignore[attr-defined]


def new_style_direct(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What `Function.apply` ends in when no functorch transform is active, minus the
    per-call `inspect.signature(cls.forward).bind(...)`: the C++ apply (private API)."""
    return super(torch.autograd.function._SingleLevelFunction, NewStyle).apply(a, b)  # type: ignore[misc]


def apply_overhead() -> None:
    a = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(4, 8, requires_grad=True)
    go = torch.randn(4, 8)
    variants: dict[str, Callable[..., Any]] = {
        "eager a * b": lambda a, b: a * b,
        "classic forward(ctx, ...)": Classic.apply,
        "new style (setup_context)": NewStyle.apply,
        "new style, __signature__ preset": NewStyleSignature.apply,
        "new style, C++ apply directly": new_style_direct,
    }
    fb = best(
        {
            k: (lambda f=f: torch.autograd.grad(f(a, b), (a, b), go))
            for k, f in variants.items()
        }
    )
    fw = best({k: (lambda f=f: f(a, b)) for k, f in variants.items()})
    print("autograd.Function styles, a * b on (4, 8), per call (µs):")
    print(f"  {'variant':<34} {'fwd+bwd':>8} {'forward':>8}")
    for k in variants:
        print(f"  {k:<34} {fb[k] * 1e6:8.1f} {fw[k] * 1e6:8.1f}")


# --------------------------------------------------------------------------- promoted


def classic_twin(generated: Any, name: str) -> Callable[..., Any]:
    """A classic-style Function around the same `f_forward`/`f_backward`, first order
    only: the context tuple is kept on ctx as is, nothing is promoted or returned extra.
    """
    fwd = getattr(generated, f"{name}_forward")
    bwd = getattr(generated, f"{name}_backward")
    takes_needs = "needs_input_grad" in inspect.signature(bwd).parameters

    class Twin(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            result, saved = fwd(*args)
            tensors = [i for i, v in enumerate(saved) if isinstance(v, torch.Tensor)]
            ctx.save_for_backward(*(saved[i] for i in tensors))
            ctx.tensors = tensors
            ctx.rest = [None if isinstance(v, torch.Tensor) else v for v in saved]
            ctx.set_materialize_grads(False)
            return result

        @staticmethod
        def backward(ctx, *grads):
            saved = list(ctx.rest)
            for i, t in zip(ctx.tensors, ctx.saved_tensors, strict=True):
                saved[i] = t
            if takes_needs:
                return bwd(tuple(saved), *grads, needs_input_grad=ctx.needs_input_grad)
            return bwd(tuple(saved), *grads)

    return Twin.apply


PROMOTED_OPS = [
    ("elementwise", "mul"),
    ("temporary", "add_mul"),
    ("normalization", "layer_norm"),
    ("attention", "attention"),
    ("mlp", "mlp"),
]


def promoted_overhead() -> None:
    print("generated Function vs a classic-style first-order twin around the same")
    print("f_forward/f_backward, tiny size, fwd+bwd per call (µs):")
    print(
        f"  {'op':<12} {'eager':>8} {'s2sgrad':>8} {'twin':>8} {'s2sgrad - twin':>15}"
    )
    for module, name in PROMOTED_OPS:
        case = build_case(module, name, "tiny")
        generated = importlib.import_module(f"samples.{module}_grad")
        case.ops["twin"] = case.bind(classic_twin(generated, name))
        ts, gos = case.tensors, case.grad_outputs
        t = best(
            {
                v: (lambda op=case.ops[v], ts=ts, gos=gos: step_fb(op, ts, gos))
                for v in ("eager", "s2sgrad", "twin")
            }
        )
        print(
            f"  {name:<12} {t['eager'] * 1e6:8.1f} {t['s2sgrad'] * 1e6:8.1f} {t['twin'] * 1e6:8.1f} "
            f"{(t['s2sgrad'] - t['twin']) * 1e6:+15.1f}"
        )


# --------------------------------------------------------------------------- compile


def compile_promoted() -> None:
    print("torch.compile (inductor, fullgraph): generated op vs the first-order twin")
    print("(no promoted outputs), fwd+bwd, ratio to compiled eager:")
    for module, name in [("mlp", "mlp"), ("attention", "attention")]:
        generated = importlib.import_module(f"samples.{module}_grad")
        twin = classic_twin(generated, name)
        for size in ("medium", "large"):
            case = build_case(module, name, size)
            case.ops["twin"] = case.bind(twin)
            ts, gos = case.tensors, case.grad_outputs
            compiled = {}
            for v in ("eager", "s2sgrad", "twin"):
                torch._dynamo.reset()
                compiled[v] = torch.compile(
                    case.ops[v], backend="inductor", fullgraph=True, dynamic=False
                )
                step_fb(compiled[v], ts, gos)
            reference = step_fb(case.ops["eager"], ts, gos)
            got = step_fb(compiled["twin"], ts, gos)
            assert all(
                torch.allclose(r, g, rtol=1e-3, atol=1e-3)
                for r, g in zip(reference, got, strict=True)
            )
            t = best(
                {
                    v: (lambda f=f, ts=ts, gos=gos: step_fb(f, ts, gos))
                    for v, f in compiled.items()
                },
                rounds=5,
                min_run_time=0.1,
            )
            e = t["eager"]
            print(
                f"  {name:<10} {size:<7} compiled eager {e * 1e3:7.2f} ms   s2sgrad "
                f"{t['s2sgrad'] / e:.2f}   twin {t['twin'] / e:.2f}"
            )


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    which = argv[0] if argv else "all"
    if which in ("apply", "all"):
        apply_overhead()
    if which in ("promoted", "all"):
        promoted_overhead()
    if which in ("compile", "all"):
        compile_promoted()


if __name__ == "__main__":
    main(sys.argv[1:])
