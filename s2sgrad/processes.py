"""Work on one module in forked processes.

A forked process starts with what this one has built (the module parsed and
judged, libcst and black loaded), so only the work's arguments and results cross
between them; a spawned one would load and build it all again, which costs more
than it saves. Linux only: elsewhere the work runs here.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

S = TypeVar("S")
T = TypeVar("T")

#: What the forked processes' work reads, handed over by the fork itself.
_STATE: Any = None


def balanced_runs(costs: Sequence[int], count: int) -> list[tuple[int, int]]:
    """Cut `range(len(costs))` into at most `count` runs `(start, stop)` in order,
    each of about an equal share of the total cost."""
    total = sum(costs)
    runs: list[tuple[int, int]] = []
    start = done = 0
    for i, cost in enumerate(costs):
        done += cost
        if done * count >= total * (len(runs) + 1) and i + 1 < len(costs):
            runs.append((start, i + 1))
            start = i + 1
    runs.append((start, len(costs)))
    return runs


def fork_map(
    fn: Callable[[tuple[int, int], S], T],
    runs: Sequence[tuple[int, int]],
    state: S,
    processes: int,
) -> list[T] | None:
    """`[fn(run, state) for run in runs]`, computed in `processes` forked processes;
    None where no fork is to be had. `fn` must be a module-level function and its
    results picklable; `state` is not pickled. An exception raised by `fn` is raised
    here, the earliest run's first."""
    if sys.platform != "linux":
        return None
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(
            min(processes, len(runs)),
            mp_context=multiprocessing.get_context("fork"),
            initializer=_adopt,
            initargs=(state,),
        )
    except (ImportError, ValueError, OSError, NotImplementedError):
        return None
    # What this process holds now is only read by the forked ones: frozen, the
    # collector there leaves it alone instead of touching (and so copying) its
    # pages, as Python's documentation of `gc.freeze` advises before a fork. Where
    # something froze objects already (the CLI freezes the engine it loaded), they
    # are left as they are: thawing ours would thaw those too.
    thaw = gc.get_freeze_count() == 0
    if thaw:
        gc.freeze()
    try:
        with pool:
            futures = [pool.submit(_call, fn, run) for run in runs]
            return [future.result() for future in futures]
    finally:
        if thaw:
            gc.unfreeze()


def _adopt(state: object) -> None:
    global _STATE
    _STATE = state


def _call(fn: Callable[[tuple[int, int], Any], T], run: tuple[int, int]) -> T:
    return fn(run, _STATE)
