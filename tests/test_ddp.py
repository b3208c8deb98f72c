"""A generated op trained under DistributedDataParallel with a gradient penalty.

Issue 22: a gradient-penalty loss through `squared_distance(x, y)`, y (d,) broadcast
against x (N, d), gave y a wrong gradient: the op's backward added the output's
gradient for y, left unreduced at (N, d) as PyTorch allows, to the temporary's
gradient reduced to (d,), and broadcasting counted the second once per row. The error
grew with the rows a process saw, so two DDP ranks on half the batch each disagreed
with one process on all of it. Here two gloo processes on CPU (tests/ddp_worker.py)
train that model for a few steps, and their gradients must equal one process's on the
whole batch, which must equal plain autograd through the closure's own forward. The
same run shows that these checks catch the bug: the worker also trains the op with
the `_accumulate` from before the fix put back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

WORKER = Path(__file__).with_name("ddp_worker.py")
WORLD_SIZE = 2
TIMEOUT_S = 120  # for both ranks together; the worker's process group gives up at 60

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)


def run_ranks(tmp_path: Path, *options: str) -> list[dict[str, Any]]:
    """Run the worker on every rank at once; each rank's saved results.

    The ranks meet through a file store in `tmp_path`, a fresh directory, rather than
    on a TCP port: no port to pick, so none to race for with pytest-xdist's other
    workers or anything else on the machine (gloo's own connections take ports the
    system hands out). A rank that hangs is killed at the deadline.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(WORLD_SIZE)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "--rank", str(rank)]
            + ["--world-size", str(WORLD_SIZE), "--init-file", str(tmp_path / "store")]
            + ["--out", str(out), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank, out in enumerate(outs)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    logs = []
    try:
        for proc in procs:
            remaining = max(deadline - time.monotonic(), 1.0)
            logs.append(proc.communicate(timeout=remaining)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"DDP ranks did not finish in {TIMEOUT_S} s")
    finally:
        for proc in procs:  # a hung rank must not outlive the test
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log}"
    return [torch.load(out) for out in outs]


def assert_steps_close(found: list[Any], expected: list[Any], what: str) -> None:
    """Every step's parameter gradients, and the parameters after it, alike."""
    assert len(found) == len(expected)
    for step, (a, b) in enumerate(zip(found, expected, strict=True)):
        for kind in ("grad", "params"):
            for name in b[kind]:
                where = f"{what}, step {step}, {kind} of {name}"

                def message(m: str, where: str = where) -> str:
                    return f"{where}: {m}"

                torch.testing.assert_close(a[kind][name], b[kind][name], msg=message)


def test_ddp_gradient_penalty_matches_one_process(tmp_path: Path) -> None:
    """Both ranks, one process on the whole batch, and the closure agree; and they
    would not with the bug. One test, not two: under pytest-xdist two tests would
    each start the two ranks (torch's import, then DDP's of torch._dynamo: most of
    the time) in different workers."""
    rank0, rank1 = run_ranks(tmp_path)
    ddp, single = rank0["ddp"]["generated"], rank0["single"]["generated"]
    closure = rank0["single"]["closure"]
    assert_steps_close(rank1["ddp"]["generated"], ddp, "rank 1 vs rank 0")
    assert_steps_close(ddp, single, "DDP vs one process")
    assert_steps_close(single, closure, "generated vs closure")

    # The same with the `_accumulate` generated modules had before the fix: y's
    # gradient is wrong in one process, and wrong differently under DDP (the error
    # grows with the rows a process sees), so the checks above would fail. w's
    # gradient, which reaches the op through x and has x's shape there, stays right
    # (compared at the first step: after it the parameters differ).
    legacy_ddp = rank0["ddp"]["legacy"]
    assert_steps_close(rank1["ddp"]["legacy"], legacy_ddp, "legacy, rank 1 vs 0")
    legacy = {
        "DDP": legacy_ddp[0]["grad"],
        "one process": rank0["single"]["legacy"][0]["grad"],
    }
    reference = closure[0]["grad"]
    for what, grads in legacy.items():
        torch.testing.assert_close(grads["w"], reference["w"])
        assert not torch.allclose(grads["y"], reference["y"]), f"legacy {what}: y right"
    assert not torch.allclose(legacy["DDP"]["y"], legacy["one process"]["y"])
