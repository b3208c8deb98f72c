"""One process of tests/test_ddp.py: trains a generated op under DDP with a penalty.

Run as a script, once per rank: `python tests/ddp_worker.py --rank R --world-size 2
--init-file F --out O`. A script started by `subprocess` rather than a function
started by `torch.multiprocessing.spawn`, because spawn re-imports the parent's
`__main__`, which under pytest (and pytest-xdist's workers) is not a module a child
can import; a script also lets the test kill a hung rank from outside.

The model holds a parameter `y` of shape (d,) that `squared_distance(x * w, y)`
broadcasts against every row of the batch x (N, d), and trains on an R1 / WGAN-GP
style loss: the output plus the squared norm of its gradient w.r.t. the input, taken
with `create_graph=True`. The penalty's gradient reaches the op's backward as the
gradient of its temporary `d = x - y`, beside the output's gradient: the place where a
gradient left unreduced, (N, d) for a parameter (d,), once met one reduced to (d,) and
was counted once per row.

Each rank trains the model twice, on a fresh copy of the generated module each time:
as generated ("generated"), and with that module's `_accumulate` replaced by the one
from before the fix ("legacy"), so that the test can show it would catch the bug. It
saves its parameter gradients, and the parameters, after every step. Rank 0 then
trains the same models on the whole batch in one process, and once more on the
closure's own forward under plain autograd ("closure"), the reference.

`--module FILE` takes the generated module from FILE instead of samples/, e.g. one
from an older commit: `git show HEAD:samples/temporary_grad.py > /tmp/head.py`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import samples.temporary as closures  # noqa: E402

BATCH, DIM, STEPS, PENALTY, LR = 8, 5, 3, 0.5, 0.05
Op = Callable[[Tensor, Tensor], Tensor]


class Model(torch.nn.Module):
    """`op(x * w, y)`: w (d,) scales each feature, y (d,) is the broadcast centre."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op = op
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, DIM, dtype=torch.float64))
        self.y = torch.nn.Parameter(torch.linspace(-1.0, 1.0, DIM, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x * self.w, self.y)


def batch() -> Tensor:
    """The whole batch, the same in every process."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, DIM, dtype=torch.float64, generator=generator)


def loss_of(model: torch.nn.Module, x: Tensor) -> Tensor:
    """Mean over this process's rows of output plus gradient penalty.

    `out` sums ||x_i * w - y||^2 over the rows; dividing by the local row count makes
    the loss a per-rank mean, so DDP's average over two equal halves is the one
    process's mean over the whole batch.
    """
    x = x.detach().requires_grad_()
    out: Tensor = model(x)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    return (out + PENALTY * (gx**2).sum()) / x.shape[0]


def train(model: torch.nn.Module, x: Tensor, params: dict[str, Tensor]) -> list[Any]:
    """A few SGD steps; each step's gradients (and the parameters after it)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    found = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, x).backward()  # type: ignore[no-untyped-call]
        grads = {name: _grad(p) for name, p in params.items()}
        optimizer.step()
        found.append({"grad": grads, "params": _values(params)})
    return found


def _grad(param: Tensor) -> Tensor:
    assert param.grad is not None, "DDP left a parameter without a gradient"
    return param.grad.detach().clone()


def _values(params: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in params.items()}


def load_op(module_path: str | None, legacy_accumulate: bool = False) -> Op:
    """`squared_distance` from a fresh copy of a generated module's file.

    `module_path` defaults to the checked-in samples/temporary_grad.py.
    `legacy_accumulate` puts back the `_accumulate` that generated modules had before
    the fix (no reduction of an unreduced total), to show the test catches that bug;
    the copy is private to the caller, so the patch reaches no other op.
    """
    path = module_path or str(ROOT / "samples" / "temporary_grad.py")
    spec = importlib.util.spec_from_file_location("_ddp_op", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if legacy_accumulate:
        assert hasattr(module, "_accumulate"), "generated modules renamed _accumulate"

        def _accumulate(total: Tensor | None, grad: Tensor | None) -> Tensor | None:
            return total if grad is None else grad if total is None else total + grad

        setattr(module, "_accumulate", _accumulate)  # noqa: B010
    return module.squared_distance  # type: ignore[no-any-return]


def run_rank(args: argparse.Namespace, ops: dict[str, Op]) -> dict[str, Any]:
    """This rank's half of the batch under DistributedDataParallel (gloo, CPU), one
    fresh model per op, all in one process group (starting one costs seconds).

    Double backward under DDP: the penalty's `autograd.grad(out.sum(), x,
    create_graph=True)` asks for x only, so it never runs the parameters' gradient
    accumulators, where DDP's reducer hooks its all-reduce; that happens once, in
    `loss.backward()`. (DDP's documented "no autograd.grad" limit is about gradients
    w.r.t. parameters.) The default find_unused_parameters=False is right: both
    parameters get a gradient every step. True also gives the right gradients on
    torch 2.13, with a warning that it found nothing unused. static_graph=True must
    not be used: on torch 2.13 CPU each rank then silently keeps its own local
    gradient, every step, and the ranks drift apart (no error, no warning). DDP wraps
    the outputs in its `_DDPSink` Function there, whose backward the inner
    `autograd.grad` runs first, apparently spending the step's delayed all-reduce on
    a pass that accumulates no parameter gradient; the same model trained without
    the penalty is right with static_graph=True.
    """
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.init_file}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        rows = batch().chunk(args.world_size)[args.rank]
        return {name: _train_ddp(op, rows) for name, op in ops.items()}
    finally:
        # DDP's reducer holds the process group, and the trained models are left in
        # reference cycles: when the collector first met them at interpreter exit,
        # the group's worker threads took the GIL during finalization and the rank
        # died with "terminate called without an active exception" (about one run
        # in ten). Collect them while the interpreter is whole, so that the group
        # really goes here.
        gc.collect()
        dist.destroy_process_group()


def _train_ddp(op: Op, rows: Tensor) -> list[Any]:
    """A fresh model around `op`, trained under DDP on this rank's rows."""
    model = Model(op)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=False)
    return train(ddp, rows, dict(model.named_parameters()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--init-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--module", help="a generated module's file (default: the checked-in sample)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # two ranks on a shared machine
    ops = {"generated": load_op(args.module), "legacy": load_op(args.module, True)}
    result: dict[str, Any] = {"ddp": run_rank(args, ops)}
    if args.rank == 0:  # the same models, one process, the whole batch
        result["single"] = {}
        for name, op in {**ops, "closure": _closure_op}.items():
            model = Model(op)
            result["single"][name] = train(
                model, batch(), dict(model.named_parameters())
            )
    torch.save(result, args.out)


def _closure_op(x: Tensor, y: Tensor) -> Tensor:
    """The closure's own forward, differentiated by plain autograd: the reference."""
    out: Tensor = closures.squared_distance(x, y)[0]
    return out


if __name__ == "__main__":
    main()
