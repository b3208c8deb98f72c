"""Benchmarks of s2sgrad: generated ops against eager autograd, hand-written Functions and
torch.compile, saved-tensor memory, and the speed of the tool itself.

    python -m benchmarks            # full run: writes benchmarks/RESULTS.md and prints it
    python benchmarks/run.py        # the same
    python -m benchmarks --quick    # a small subset for development (< 2 min); prints only

See `--help` for the options. Variants measured per sample op and size:

(a) eager    autograd through the closure's own forward (`out, _ = f(...)`)
(b) s2sgrad  the generated op `samples.<module>_grad.<f>`
(c) hand     a hand-written `torch.autograd.Function` (`benchmarks/handwritten.py`)
(d) floor    `f_forward` + `f_backward` called directly under `torch.no_grad()`
(e) compiled `torch.compile` of (a) and of (b), fullgraph=True, static shapes
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if (
    str(ROOT) not in sys.path
):  # `python benchmarks/run.py` puts benchmarks/ first instead
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.utils.benchmark as tbench  # noqa: E402

from benchmarks import (  # noqa: E402
    cases,
    compiled_mode,
    convert_speed,
    forward_mode,
    generated_size,
    handwritten,
    per_call,
)

SAMPLES = ROOT / "samples"
FB_VARIANTS = (
    "eager",
    "s2sgrad",
    "hand",
    "floor",
    "compiled_eager",
    "compiled_s2sgrad",
)
DB_VARIANTS = ("eager", "s2sgrad", "hand")
DIRECTORY_LABELS = {
    "synthetic": "benchmark input in {files} modules",
    "corpus": "tests/corpus/",
}
KIND_LABELS = {
    "def": "`def`/`class` lines",
    "wrapped": "signature lines black wrapped",
    "docstring": "docstrings",
    "decorator": "decorators",
    "body": "the rest (bodies)",
}
QUICK_OPS = {"mul", "add_mul", "layer_norm", "softmax", "mean_var"}
TARGETS = {
    "hand": 1.05,
    "eager": 0.9,
    "memory": 0.6,
    "compile": 1.1,
    "convert_lines_per_s": 500.0,
    "convert_goal_lines_per_s": 1000.0,
    "check_lines_per_s": 20000.0,
    "workers_speedup": 1.3,
    "size_ratio": 4.0,
    "size_median": 4.5,
    "import_overhead_ms": 1.0,
}


# --------------------------------------------------------------------------- discovery


def discover() -> list[tuple[str, str]]:
    """(module, function) of every differentiator in samples/, via s2sgrad's frontend."""
    from s2sgrad.frontend import parse

    found = []
    for path in sorted(SAMPLES.glob("*.py")):
        if path.name == "__init__.py" or path.stem.endswith("_grad"):
            continue
        parsed = parse(path.read_text(), str(path.relative_to(ROOT)))
        found.extend((path.stem, d.name) for d in parsed.differentiators)
    return found


# --------------------------------------------------------------------------- one case


def as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


@dataclass
class Case:
    """The callables and inputs of one (op, size)."""

    module: str
    name: str
    size: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    positions: list[int]  # indices of the differentiable tensors in args
    tensors: list[torch.Tensor]  # those tensors, requiring grad
    grad_outputs: tuple[torch.Tensor, ...]
    ops: dict[str, Callable[..., Any]] = field(
        default_factory=dict
    )  # name -> op(*tensors)
    floor: Callable[[], Any] | None = None

    def bind(self, fn: Callable[..., Any], first: bool = False) -> Callable[..., Any]:
        """`fn` as an op of the differentiable tensors only (other arguments fixed)."""
        args, kwargs, positions = list(self.args), self.kwargs, self.positions

        def op(*tensors: torch.Tensor) -> Any:
            call = list(args)
            for i, t in zip(positions, tensors, strict=True):
                call[i] = t
            out = fn(*call, **kwargs)
            return out[0] if first else out

        op.__name__ = f"{self.name}_{getattr(fn, '__name__', 'op')}"
        return op


def build_case(module: str, name: str, size: str) -> Case:
    args, kwargs = cases.make_inputs(module, name, size)
    positions = [
        i
        for i, a in enumerate(args)
        if isinstance(a, torch.Tensor) and a.is_floating_point()
    ]
    tensors = [args[i].requires_grad_() for i in positions]
    source = importlib.import_module(f"samples.{module}")
    generated = importlib.import_module(f"samples.{module}_grad")
    src_fn = getattr(source, name)
    with torch.no_grad():
        result, _ = src_fn(*args, **kwargs)
    torch.manual_seed(1)
    grad_outputs = tuple(torch.randn_like(o) for o in as_tuple(result))
    case = Case(
        module, name, size, tuple(args), kwargs, positions, tensors, grad_outputs
    )
    case.ops["eager"] = case.bind(src_fn, first=True)
    case.ops["s2sgrad"] = case.bind(getattr(generated, name))
    if (module, name) in handwritten.OPS:
        case.ops["hand"] = case.bind(handwritten.OPS[(module, name)])

    fwd = getattr(generated, f"{name}_forward")
    bwd = getattr(generated, f"{name}_backward")
    plain = list(args)
    for i in positions:
        plain[i] = args[i].detach()

    def floor() -> Any:
        with torch.no_grad():
            _, ctx = fwd(*plain, **kwargs)
            return bwd(ctx, *grad_outputs)

    case.floor = floor
    return case


def step_fb(op: Callable[..., Any], tensors: Sequence[torch.Tensor], gos: tuple) -> Any:
    """Forward, then the gradients of all differentiable inputs."""
    outs = as_tuple(op(*tensors))
    return torch.autograd.grad(outs, tensors, gos, allow_unused=True)


def step_db(op: Callable[..., Any], tensors: Sequence[torch.Tensor], gos: tuple) -> Any:
    """Forward, gradients with create_graph, then the gradient of the sum of the gradients."""
    outs = as_tuple(op(*tensors))
    grads = torch.autograd.grad(
        outs, tensors, gos, create_graph=True, allow_unused=True
    )
    sums = [g.sum() for g in grads if g is not None and g.requires_grad]
    if not sums:  # a linear op: its gradients do not depend on the inputs
        return grads, None
    return grads, torch.autograd.grad(sum(sums), tensors, allow_unused=True)


# --------------------------------------------------------------------------- correctness


def agree(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    a, b = as_tuple(a), as_tuple(b)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if not (x is None or not x.abs().any()) or not (
                y is None or not y.abs().any()
            ):
                return False
            continue
        if not torch.allclose(
            x, y, rtol=rtol, atol=atol * max(1.0, x.abs().max().item())
        ):
            return False
    return True


def same_second_order(a: Any, b: Any) -> bool:
    """Second-stage gradients agree; a stage that did not run counts as all zeros."""
    if a is None and b is None:
        return True
    if a is None or b is None:
        return not any(
            g is not None and g.abs().any() for g in as_tuple(a if b is None else b)
        )
    return agree(a, b)


def check(case: Case) -> dict[str, str]:
    """Whether (b), (c) and (d) give the same gradients as (a), first and second order."""
    result = {}
    ref_fb = step_fb(case.ops["eager"], case.tensors, case.grad_outputs)
    ref_db = step_db(case.ops["eager"], case.tensors, case.grad_outputs)
    for variant in ("s2sgrad", "hand"):
        if variant not in case.ops:
            continue
        fb = step_fb(case.ops[variant], case.tensors, case.grad_outputs)
        db = step_db(case.ops[variant], case.tensors, case.grad_outputs)
        ok_fb = agree(ref_fb, fb)
        ok_db = agree(ref_db[0], db[0]) and same_second_order(ref_db[1], db[1])
        result[variant] = (
            "ok" if ok_fb and ok_db else ("order 2 differs" if ok_fb else "differs")
        )
    floor_grads = as_tuple(case.floor())  # type: ignore[misc]
    picked = tuple(floor_grads[i] for i in case.positions)
    result["floor"] = "ok" if agree(ref_fb, picked) else "differs"
    return result


# --------------------------------------------------------------------------- timing


def measure(
    fn: Callable[[], Any], threads: int, min_run_time: float, clock: str
) -> float:
    timer = tbench.Timer(
        stmt="fn()",
        globals={"fn": fn},
        num_threads=threads,
        timer=time.thread_time if clock == "cpu" else time.perf_counter,
    )
    return timer.blocked_autorange(min_run_time=min_run_time).median


@dataclass
class Compiled:
    fn: Callable[..., Any] | None
    compile_s: float
    breaks: str  # "0" when fullgraph=True compiled; else the break reason
    error: str | None = None


def compile_op(op: Callable[..., Any], case: Case, backend: str) -> Compiled:
    """torch.compile(op) with fullgraph=True, compiled by one fwd+bwd call."""
    start = time.perf_counter()
    try:
        fn = torch.compile(op, backend=backend, fullgraph=True, dynamic=False)
        step_fb(fn, case.tensors, case.grad_outputs)
        return Compiled(fn, time.perf_counter() - start, "0")
    except Exception as exc:  # a graph break (fullgraph) or a compile failure
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    try:
        explain = torch._dynamo.explain(op)(*case.tensors)
        breaks = f"{explain.graph_break_count} ({reason})"
        fn = torch.compile(op, backend=backend, dynamic=False)
        step_fb(fn, case.tensors, case.grad_outputs)
        return Compiled(fn, time.perf_counter() - start, breaks)
    except Exception as exc:
        return Compiled(
            None, time.perf_counter() - start, "?", f"{reason}; {exc}"[:300]
        )


def run_case(
    case: Case, cfg: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    row: dict[str, Any] = {"module": case.module, "op": case.name, "size": case.size}
    row["check"] = check(case) if case.size == "tiny" or cfg.quick else None
    ts, gos = case.tensors, case.grad_outputs
    fb: dict[str, Callable[[], Any]] = {
        v: (lambda op=op: step_fb(op, ts, gos)) for v, op in case.ops.items()
    }
    db: dict[str, Callable[[], Any]] = {
        v: (lambda op=op: step_db(op, ts, gos)) for v, op in case.ops.items()
    }
    fb["floor"] = case.floor  # type: ignore[assignment]
    if cfg.backend != "none":
        torch._dynamo.reset()
        compiled = {}
        for variant in ("eager", "s2sgrad"):
            c = compile_op(case.ops[variant], case, cfg.backend)
            compiled[variant] = c
            if c.fn is not None:
                fb[f"compiled_{variant}"] = lambda fn=c.fn: step_fb(fn, ts, gos)
        row["compile"] = {
            v: {"compile_s": c.compile_s, "breaks": c.breaks, "error": c.error}
            for v, c in compiled.items()
        }
    times_fb: dict[str, float] = {}
    times_db: dict[str, float] = {}
    # Interleaved rounds; keep the lowest median of each. Tiny calls are cheap and the
    # noisiest relative to their length: twice the rounds, half the time per round.
    rounds, min_run_time = cfg.rounds, cfg.min_run_time
    if case.size == "tiny" and not cfg.quick:
        rounds, min_run_time = 2 * rounds, min_run_time / 2
    for _ in range(rounds):
        for v, fn in fb.items():
            t = measure(fn, cfg.threads, min_run_time, cfg.clock)
            times_fb[v] = min(t, times_fb.get(v, math.inf))
        for v, fn in db.items():
            t = measure(fn, cfg.threads, min_run_time, cfg.clock)
            times_db[v] = min(t, times_db.get(v, math.inf))
    row["fb"], row["db"] = times_fb, times_db
    row["db_second_stage"] = {
        v: step_db(op, ts, gos)[1] is not None for v, op in case.ops.items()
    }
    log(
        f"  {case.name:<18} {case.size:<6} fb eager {fmt_time(times_fb['eager'])} "
        f"s2sgrad x{times_fb['s2sgrad'] / times_fb['eager']:.2f}"
        + (
            f" compiled x{times_fb['compiled_s2sgrad'] / times_fb['compiled_eager']:.2f}"
            if "compiled_s2sgrad" in times_fb and "compiled_eager" in times_fb
            else ""
        )
    )
    return row


# --------------------------------------------------------------------------- memory


def saved_bytes(
    op: Callable[..., Any], tensors: Sequence[torch.Tensor]
) -> dict[str, int]:
    """Bytes of the distinct storages saved for backward by one forward call of op."""
    storages: dict[int, int] = {}
    count = 0
    inputs = {t.untyped_storage().data_ptr() for t in tensors}

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = op(*tensors)
    total = sum(storages.values())
    not_inputs = sum(n for p, n in storages.items() if p not in inputs)
    del out
    return {"total": total, "not_inputs": not_inputs, "tensors": count}


def memory_rows(ops: list[tuple[str, str]], size: str) -> list[dict[str, Any]]:
    rows = []
    for module, name in ops:
        case = build_case(module, name, size)
        row: dict[str, Any] = {"module": module, "op": name}
        for variant, op in case.ops.items():
            row[variant] = saved_bytes(op, case.tensors)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- tool speed


def import_hook_overhead(log: Callable[[str], None]) -> dict[str, Any]:
    script = ROOT / "benchmarks" / "import_hook.py"
    if not script.exists():
        return {"status": "missing"}
    log("import hook: python benchmarks/import_hook.py")
    try:
        proc = subprocess.run(
            [sys.executable, str(script)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    result: dict[str, Any] = {
        "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    }
    result["output"] = proc.stdout.strip() + (
        "\n" + proc.stderr.strip() if proc.returncode else ""
    )
    # Lines look like: "  temporary  hook, cache hit  median wall   91.0 us (  +3.2)  cpu ..."
    overheads = []
    for line in proc.stdout.splitlines():
        if "hook, cache hit" in line and "(" in line:
            try:
                overheads.append(float(line.split("(", 1)[1].split(")", 1)[0]))
            except ValueError:
                pass
    if overheads:
        result["overhead_us"] = overheads
    return result


# --------------------------------------------------------------------------- report


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def ratio(t: dict[str, float], num: str, den: str) -> str:
    if num in t and den in t:
        return f"{t[num] / t[den]:.2f}"
    return "–"


def geomean(xs: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def machine(threads: int, load_start: str, samples: Sequence[float] = ()) -> list[str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = "{:.2f} / {:.2f} / {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "unknown"
    return [
        f"- CPU: {cpu}, {os.cpu_count()} logical cores visible"
        f" (`torch.backends.cpu.get_cpu_capability()`: {torch.backends.cpu.get_cpu_capability()})",
        f"- Memory: {mem_total()}",
        f"- Python {platform.python_version()}, torch {torch.__version__}, {platform.system()}"
        f" {platform.release()}",
        f"- torch threads: {threads} (`torch.set_num_threads({threads})`, also passed to every"
        " `torch.utils.benchmark.Timer`)",
        f"- Load average (1/5/15 min) at the start of the run: {load_start}; at the end: {load}"
        + (
            f"; 1-min load at each of the run's {len(samples)} steps: "
            f"{min(samples):.2f} to {max(samples):.2f}, median "
            f"{statistics.median(samples):.2f}"
            if samples
            else ""
        )
        + f" (other work shared the machine's {os.cpu_count()} cores during the run)",
    ]


def mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def targets_table(summary: dict[str, Any], previous: dict[str, Any]) -> list[str]:
    when = f" ({previous['date']})" if previous.get("date") else ""
    lines = [
        f"| target | measured | previous run{when} | met |",
        "|---|---|---|---|",
    ]
    for label, measured, was, met in summary["targets"]:
        verdict = (
            {True: "yes", False: "**no**", None: "n/a"}.get(met, met)
            if not isinstance(met, str)
            else f"**{met}**"
        )
        lines.append(f"| {label} | {measured} | {was} | {verdict} |")
    return lines


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """Headline numbers of one run, from its raw numbers as `--json` writes them: what
    the next run's report shows as "previous run". Numbers an older run did not
    measure are left out."""
    rows = data.get("runtime") or []
    mem = data.get("memory") or []
    tool = data.get("convert") or {}
    hook = data.get("import_hook") or {}
    f: dict[str, Any] = {"date": data.get("date")}
    for line in data.get("machine") or []:
        if line.startswith("- CPU: "):
            f["cpu"] = line.removeprefix("- CPU: ").split(",")[0]
        if line.startswith("- Load average"):
            f["load"] = line.removeprefix("- ").split(" (other work")[0]
    for size in cases.SIZES:
        sel = [r for r in rows if r["size"] == size]
        hand = [r for r in sel if "hand" in r["fb"] and "hand" in r["db"]]
        if hand:
            f[f"hand_fb_{size}"] = geomean(
                [r["fb"]["s2sgrad"] / r["fb"]["hand"] for r in hand]
            )
            f[f"hand_db_{size}"] = geomean(
                [r["db"]["s2sgrad"] / r["db"]["hand"] for r in hand]
            )
        if sel:
            f[f"eager_fb_{size}"] = geomean(
                [r["fb"]["s2sgrad"] / r["fb"]["eager"] for r in sel]
            )
            f[f"eager_db_{size}"] = geomean(
                [r["db"]["s2sgrad"] / r["db"]["eager"] for r in sel]
            )
        both = [
            r["fb"]["compiled_s2sgrad"] / r["fb"]["compiled_eager"]
            for r in sel
            if "compiled_s2sgrad" in r["fb"] and "compiled_eager" in r["fb"]
        ]
        if both:
            f[f"compiled_{size}"] = geomean(both)
        if size == "tiny" and sel:
            f["tiny_wrapper_us"] = {
                r["op"]: (r["fb"]["s2sgrad"] - r["fb"]["floor"]) * 1e6 for r in sel
            }
    ratios = [
        m["s2sgrad"]["total"] / m["eager"]["total"] for m in mem if m["eager"]["total"]
    ]
    if ratios:
        f["memory_mean"] = statistics.fmean(ratios)
    inputs = {"synthetic": tool, "closures": tool.get("closures") or {}}
    for name, result in inputs.items():
        for key in (
            "lines_per_s",
            "warm_lines_per_s",
            "check_lines_per_s",
            "lines_per_s_excluding_startup",
            "lines_per_cpu_s",
            "startup_s",
        ):
            if key in result:
                f[f"{name}_{key}"] = result[key]
    for name, result in (tool.get("directories") or {}).items():
        for j, per in result["workers"].items():
            f[f"dir_{name}_j{j}_lines_per_s"] = per["lines_per_s"]
        f[f"dir_{name}_speedup"] = result["speedup"]
        f[f"dir_{name}_check_lines_per_s"] = result["check_lines_per_s"]
    size = tool.get("size") or {}
    if size:
        f["size_ratio"] = size["ratio"]
        f["size_median"] = size["median_per_differentiator"]
        f["size_worst"] = list(size["worst"])
        f["size_runtime_lines"] = size["runtime_lines"]
        # Before the runtime was imported, every line counted and every module carried
        # the runtime.
        f["size_old_method"] = "ratio_without_runtime" in size
        if "ratio_without_runtime" in size:
            f["size_ratio_without_runtime"] = size["ratio_without_runtime"]
        if "per_differentiator" in size:
            f["size_per_differentiator"] = size["per_differentiator"]
    compiled = tool.get("compiled") or {}
    if compiled:
        f["compiled_mode_fb"] = compiled["geomean_fb"]
        f["compiled_mode_db"] = compiled["geomean_db"]
    calls = tool.get("per_call") or {}
    if calls:
        for key in ("median_op_overhead_us", "median_apply_overhead_us"):
            f[f"per_call_{key}"] = calls[key]
        f["per_call_median_saved_us"] = calls["median_saved_us"]
        f["per_call_rows"] = {r["name"]: r["op"] for r in calls["rows"]}
    for size, result in (tool.get("forward_mode") or {}).items():
        f[f"forward_mode_{size}"] = result["geomean_transpose_over_forward"]
        f[f"forward_mode_rows_{size}"] = {
            r["name"]: r["transpose"] / r["forward"]
            for r in result["rows"]
            if "forward" in r
        }
    if hook.get("overhead_us"):
        f["hook_worst_ms"] = max(hook["overhead_us"]) / 1000
    return {k: v for k, v in f.items() if v is not None}


def was(prev: dict[str, Any], key: str, spec: str = ".2f", unit: str = "") -> str:
    """The previous run's `key` formatted, or "–" where it was not measured."""
    return f"{format(prev[key], spec)}{unit}" if key in prev else "–"


def summarize(
    rows: list[dict[str, Any]],
    mem: list[dict[str, Any]],
    tool: dict[str, Any],
    hook: dict[str, Any],
    sizes: Sequence[str],
    prev: dict[str, Any],
) -> dict[str, Any]:
    summary: dict[str, Any] = {"targets": []}
    t = summary["targets"]
    for size in sizes:
        sel = [r for r in rows if r["size"] == size]
        vs_hand = [
            r["fb"]["s2sgrad"] / r["fb"]["hand"] for r in sel if "hand" in r["fb"]
        ]
        vs_hand_db = [
            r["db"]["s2sgrad"] / r["db"]["hand"] for r in sel if "hand" in r["db"]
        ]
        if vs_hand:
            worst = max(
                zip(vs_hand, [r["op"] for r in sel if "hand" in r["fb"]], strict=True)
            )
            worst_db = max(
                zip(
                    vs_hand_db, [r["op"] for r in sel if "hand" in r["db"]], strict=True
                )
            )
            gm, gm_db = geomean(vs_hand), geomean(vs_hand_db)
            t.append(
                (
                    f"(b)/(c) <= {TARGETS['hand']} at {size} (geomean over {len(vs_hand)} ops)",
                    f"fwd+bwd {gm:.2f} (worst {worst[0]:.2f} `{worst[1]}`); "
                    f"double {gm_db:.2f} (worst {worst_db[0]:.2f} `{worst_db[1]}`)",
                    f"fwd+bwd {was(prev, f'hand_fb_{size}')}; "
                    f"double {was(prev, f'hand_db_{size}')}",
                    gm <= TARGETS["hand"] and gm_db <= TARGETS["hand"],
                )
            )
    for size in sizes:
        if size == "tiny":
            continue
        sel = [r for r in rows if r["size"] == size]
        vs_eager = [r["fb"]["s2sgrad"] / r["fb"]["eager"] for r in sel]
        vs_eager_db = [r["db"]["s2sgrad"] / r["db"]["eager"] for r in sel]
        if vs_eager:
            ok = sum(x <= TARGETS["eager"] for x in vs_eager)
            t.append(
                (
                    f"(b)/(a) <= {TARGETS['eager']} at {size} (geomean over {len(sel)} ops)",
                    f"fwd+bwd {geomean(vs_eager):.2f} ({ok}/{len(sel)} ops <= {TARGETS['eager']}, "
                    f"worst {max(vs_eager):.2f}); double {geomean(vs_eager_db):.2f}",
                    f"fwd+bwd {was(prev, f'eager_fb_{size}')}; "
                    f"double {was(prev, f'eager_db_{size}')}",
                    geomean(vs_eager) <= TARGETS["eager"],
                )
            )
    if mem:
        ratios = [
            m["s2sgrad"]["total"] / m["eager"]["total"]
            for m in mem
            if m["eager"]["total"]
        ]
        total = sum(m["s2sgrad"]["total"] for m in mem) / max(
            1, sum(m["eager"]["total"] for m in mem)
        )
        summary["memory_mean_ratio"] = statistics.fmean(ratios)
        t.append(
            (
                f"saved bytes (b)/(a) <= {TARGETS['memory']} on average",
                f"mean of per-op ratios {statistics.fmean(ratios):.2f}; ratio of totals {total:.2f}",
                f"mean {was(prev, 'memory_mean')}",
                statistics.fmean(ratios) <= TARGETS["memory"],
            )
        )
    compiled = [
        r for r in rows if "compiled_s2sgrad" in r["fb"] and "compiled_eager" in r["fb"]
    ]
    if compiled:
        per_size = []
        met = True
        for size in sizes:
            xs = [
                r["fb"]["compiled_s2sgrad"] / r["fb"]["compiled_eager"]
                for r in compiled
                if r["size"] == size
            ]
            if xs:
                per_size.append(f"{size} {geomean(xs):.2f} (worst {max(xs):.2f})")
                met = met and geomean(xs) <= TARGETS["compile"]
        breaks = [
            f"{r['op']}/{r['size']}"
            for r in rows
            if r.get("compile", {}).get("s2sgrad", {}).get("breaks") not in ("0", None)
        ]
        slow = sorted(
            {
                r["op"]
                for r in compiled
                if r["size"] != "tiny"
                and all(
                    q["fb"]["compiled_s2sgrad"] / q["fb"]["compiled_eager"]
                    > TARGETS["compile"]
                    for q in compiled
                    if q["op"] == r["op"] and q["size"] != "tiny"
                )
            }
        )
        t.append(
            (
                f"compiled (b) / compiled (a) <= {TARGETS['compile']}, no graph breaks",
                "geomean "
                + "; ".join(per_size)
                + f"; above {TARGETS['compile']} at every size but tiny: "
                + (", ".join(f"`{op}`" for op in slow) or "none")
                + f"; graph breaks or failures in (b): {', '.join(breaks) or 'none'}",
                "; ".join(f"{s} {was(prev, f'compiled_{s}')}" for s in sizes),
                (met and not breaks and not slow)
                or ("partly" if met and not breaks else False),
            )
        )
    if tool.get("lines_per_s"):
        least = TARGETS["convert_lines_per_s"]
        closures = tool.get("closures") or {}
        cold = [tool["lines_per_s"]] + ([closures["lines_per_s"]] if closures else [])
        t.append(
            (
                f"`s2sgrad convert` >= {least:.0f} source lines/s cold (goal "
                f"{TARGETS['convert_goal_lines_per_s']:.0f}), on the benchmark input "
                "and on closure-style modules",
                f"benchmark input {tool['lines_per_s']:.0f} lines/s "
                f"({tool['source_lines']} lines, {tool['wall_s']:.1f} s)"
                + (
                    f"; tests/corpus/ as one module {closures['lines_per_s']:.0f} "
                    f"lines/s ({closures['source_lines']} lines, "
                    f"{closures['wall_s']:.1f} s)"
                    if closures
                    else ""
                ),
                f"benchmark input {was(prev, 'synthetic_lines_per_s', '.0f')}; "
                f"tests/corpus/ {was(prev, 'closures_lines_per_s', '.0f')}",
                all(c >= least for c in cold)
                or ("partly" if any(c >= least for c in cold) else False),
            )
        )
        if "check_lines_per_s" in tool:
            checks = [tool["check_lines_per_s"]] + (
                [closures["check_lines_per_s"]] if closures else []
            )
            least = TARGETS["check_lines_per_s"]
            t.append(
                (
                    f"`s2sgrad convert --check`, outputs up to date, >= "
                    f"{least:.0f} source lines/s",
                    f"benchmark input {tool['check_lines_per_s']:.0f} lines/s "
                    f"({tool['check_wall_s'] * 1000:.0f} ms)"
                    + (
                        f"; tests/corpus/ as one module "
                        f"{closures['check_lines_per_s']:.0f} lines/s "
                        f"({closures['check_wall_s'] * 1000:.0f} ms)"
                        if closures
                        else ""
                    )
                    + "; start-up included",
                    f"benchmark input {was(prev, 'synthetic_check_lines_per_s', '.0f')}; "
                    f"tests/corpus/ {was(prev, 'closures_check_lines_per_s', '.0f')}",
                    all(c >= least for c in checks)
                    or ("partly" if any(c >= least for c in checks) else False),
                )
            )
        dirs = tool.get("directories") or {}
        if dirs:
            least = TARGETS["workers_speedup"]
            t.append(
                (
                    "many files convert on every core: `-j 2` at least "
                    f"{least}x as fast as `-j 1` on a directory (2 cores)",
                    "; ".join(
                        f"{DIRECTORY_LABELS.get(name, name).format(files=d['files'])} "
                        f"{d['speedup']:.2f}x "
                        f"({d['workers']['1']['lines_per_s']:.0f} → "
                        f"{d['workers']['2']['lines_per_s']:.0f} lines/s)"
                        for name, d in dirs.items()
                    ),
                    "; ".join(
                        f"{name} {was(prev, f'dir_{name}_speedup')}" for name in dirs
                    ),
                    all(d["speedup"] >= least for d in dirs.values()),
                )
            )
    compiled = tool.get("compiled") if tool else None
    if compiled:
        t.append(
            (
                f"`--compile` fwd+bwd / torch.compile of the closure <= "
                f"{compiled['target_fb']} (geomean)",
                f"{compiled['geomean_fb']:.2f} over {len(compiled['rows'])} op-sizes",
                was(prev, "compiled_mode_fb"),
                compiled["geomean_fb"] <= compiled["target_fb"],
            )
        )
        t.append(
            (
                f"`--compile` double backward / eager <= {compiled['target_db']} "
                "(geomean)",
                f"{compiled['geomean_db']:.2f}",
                was(prev, "compiled_mode_db"),
                compiled["geomean_db"] <= compiled["target_db"],
            )
        )
    size = tool.get("size") if tool else None
    if size:
        previous_size = (
            f"{was(prev, 'size_ratio')}; median {was(prev, 'size_median')}"
            + (
                " (all lines counted, the runtime in every module)"
                if prev.get("size_old_method")
                else ""
            )
        )
        t.append(
            (
                f"generated / source non-blank lines over samples/ <= "
                f"{TARGETS['size_ratio']} (runtime imported, counted once, "
                f"separately), median per differentiator <= {TARGETS['size_median']}",
                f"{size['ratio']:.2f} ({size['generated_lines']} / {size['source_lines']}); "
                f"median {size['median_per_differentiator']:.2f} "
                f"(worst {size['worst'][1]:.2f} `{size['worst'][0]}`); runtime "
                f"{size['runtime_lines']} lines once",
                previous_size,
                size["ratio"] <= TARGETS["size_ratio"]
                and size["median_per_differentiator"] <= TARGETS["size_median"],
            )
        )
    if hook.get("overhead_us"):
        worst = max(hook["overhead_us"])
        t.append(
            (
                f"import hook cached import overhead < {TARGETS['import_overhead_ms']:.0f} ms per module",
                f"{worst / 1000:.3f} ms worst over {len(hook['overhead_us'])} modules (wall, vs a plain .pyc import)",
                was(prev, "hook_worst_ms", ".3f", " ms"),
                worst / 1000 < TARGETS["import_overhead_ms"],
            )
        )
    elif hook:
        t.append(
            (
                "import hook cached import overhead < 1 ms",
                f"not measured ({hook.get('status')})",
                was(prev, "hook_worst_ms", ".3f", " ms"),
                None,
            )
        )
    return summary


def report(
    cfg: argparse.Namespace,
    rows: list[dict[str, Any]],
    mem: list[dict[str, Any]],
    tool: dict[str, Any],
    hook: dict[str, Any],
    elapsed: float,
    machine_lines: list[str],
    date: str,
    previous: dict[str, Any] | None = None,
) -> str:
    """The report; `previous` is the previous run's `figures`, shown beside this one's."""
    prev = previous or {}
    sizes = [s for s in cases.SIZES if s in cfg.sizes]
    summary = summarize(rows, mem, tool, hook, sizes, prev)
    out: list[str] = []
    w = out.append
    w("# s2sgrad benchmark results")
    w("")
    w(
        f"Written by `python -m benchmarks{' --quick' if cfg.quick else ''}` on "
        f"{date} in {elapsed / 60:.1f} min. Do not edit the measured "
        "sections by hand; rerun the command. The notes on missed targets come from "
        "`benchmarks/notes.md`."
    )
    w("")
    w("## Machine")
    w("")
    out.extend(machine_lines)
    w("")
    w("## Method")
    w("")
    w(
        "Every differentiator in `samples/*.py` (found with `s2sgrad.frontend.parse`) is run at "
        "three sizes on float32 CPU tensors; every floating-point tensor argument requires grad. "
        "Shapes:"
    )
    w("")
    w("| ops | tiny | medium | large |")
    w("|---|---|---|---|")
    for label, shapes in cases.SHAPE_NOTES.items():
        w(f"| {label} | " + " | ".join(shapes[s] for s in cases.SIZES) + " |")
    w("")
    w(
        "Variants: **(a) eager** calls the source differentiator and uses only its result "
        "(`out, _ = f(...)`), so torch.autograd differentiates the forward; **(b) s2sgrad** is "
        "the generated op `samples/<module>_grad.py:<f>`; **(c) hand** is a hand-written "
        "`torch.autograd.Function` from `benchmarks/handwritten.py` (right at every order: it "
        "saves inputs/outputs and recomputes temporaries), for "
        f"{len(handwritten.OPS)} ops; **(d) floor** calls `f_forward` then `f_backward` directly "
        "under `torch.no_grad()` (first order only: the cost of the math without autograd); "
        f'**(e) compiled** is `torch.compile(op, backend="{cfg.backend}", fullgraph=True, '
        "dynamic=False)` of (a) and of (b), one compile per op and size."
    )
    w("")
    w(
        "- fwd+bwd: the forward, then `torch.autograd.grad(outputs, inputs, grad_outputs)` with "
        "fixed random `grad_outputs`."
    )
    w(
        "- double: the forward, `torch.autograd.grad(..., create_graph=True)`, then the gradient "
        "of the sum of all first-order gradients w.r.t. the inputs. For linear ops (the "
        "reductions) the first-order gradients do not depend on the inputs, so the second "
        "stage has nothing to do and is skipped (marked `lin`). torch.compile does not support "
        "double backward (AOTAutograd raises `torch.compile with aot_autograd does not "
        "currently support double backward`), so (e) is fwd+bwd only."
    )
    w(
        f"- Timing: `torch.utils.benchmark.Timer.blocked_autorange(min_run_time={cfg.min_run_time})`, "
        f"median per block; the variants of one op and size are measured interleaved in "
        f"{cfg.rounds} round(s)"
        + (
            ""
            if cfg.quick
            else f" ({2 * cfg.rounds} of {cfg.min_run_time / 2} s at the tiny size)"
        )
        + " and the lowest median of each is kept, so that all ratios compare "
        "numbers taken moments apart in the same process. Ratios are to (a) of the same run."
    )
    if cfg.clock == "cpu":
        w(
            "- Clock: `time.thread_time` (CPU time of the calling thread) passed as the Timer's "
            "`timer`. With one torch thread all CPU tensor work, the autograd engine's included, "
            "runs on the calling thread, so this is the op's cost, and it does not count time "
            "spent waiting while other processes use the cores (this machine is shared; see the "
            "load average above). `--clock wall` uses `time.perf_counter` instead."
        )
    else:
        w("- Clock: wall time (`time.perf_counter`).")
    w(
        "- At the tiny size, (b), (c) and (d) are first checked against (a) (first- and "
        "second-order gradients, `allclose` rtol 1e-4); the `check` column shows the result."
    )
    w("")
    w("## Targets")
    w("")
    out.extend(targets_table(summary, prev))
    w("")
    if prev:
        cpu = machine_lines[0].removeprefix("- CPU: ").split(",")[0]
        w(
            f"The previous run ({prev.get('date', 'date unknown')}) is the one whose "
            "raw numbers this run found in `benchmarks/results.json`. It ran on "
            f"{prev.get('cpu', 'an unrecorded CPU')}, this one on {cpu}"
            + (
                " (the same model)"
                if prev.get("cpu") == cpu
                else ": absolute times differ by the machine as well as by the code; "
                "ratios measured within one run (b/a, b/c, t/f, speed-ups) compare "
                "across machines better"
            )
            + (
                f". Its {prev['load'][0].lower()}{prev['load'][1:]}."
                if "load" in prev
                else "."
            )
        )
        w("")
    notes = ROOT / "benchmarks" / "notes.md"
    if notes.exists() and not cfg.quick:
        w(notes.read_text().strip())
        w("")
    w("## Runtime: forward + backward")
    w("")
    w(
        "Time of (a); the other columns are ratios to (a) (lower is faster). `b/c` is the "
        "generated op against the hand-written Function, `cb/ca` compiled (b) against compiled "
        "(a)."
    )
    for size in sizes:
        sel = [r for r in rows if r["size"] == size]
        if not sel:
            continue
        w("")
        w(f"### {size}")
        w("")
        w(
            "| op | (a) eager | (b) s2sgrad | (c) hand | (d) floor | (e) compiled a | (e) compiled b | b/c | cb/ca | check |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|")
        for r in sel:
            t = r["fb"]
            chk = r.get("check") or {}
            chk_s = ", ".join(f"{k} {v}" for k, v in chk.items() if v != "ok") or (
                "ok" if chk else ""
            )
            w(
                f"| `{r['op']}` | {fmt_time(t['eager'])} | {ratio(t, 's2sgrad', 'eager')} | "
                f"{ratio(t, 'hand', 'eager')} | {ratio(t, 'floor', 'eager')} | "
                f"{ratio(t, 'compiled_eager', 'eager')} | {ratio(t, 'compiled_s2sgrad', 'eager')} | "
                f"{ratio(t, 's2sgrad', 'hand')} | {ratio(t, 'compiled_s2sgrad', 'compiled_eager')} | {chk_s} |"
            )
        gm = geomean([r["fb"]["s2sgrad"] / r["fb"]["eager"] for r in sel])
        w(
            f"| geomean | | {gm:.2f} | | {geomean([r['fb']['floor'] / r['fb']['eager'] for r in sel]):.2f} | | | | | |"
        )
    w("")
    w("## Runtime: double backward")
    w("")
    w(
        "Time of (a); ratios to (a). `lin`: the op is linear, no second stage ran for that variant."
    )
    for size in sizes:
        sel = [r for r in rows if r["size"] == size]
        if not sel:
            continue
        w("")
        w(f"### {size}")
        w("")
        w("| op | (a) eager | (b) s2sgrad | (c) hand | b/c |")
        w("|---|---|---|---|---|")
        for r in sel:
            t = r["db"]
            lin = {v: ("" if s else " lin") for v, s in r["db_second_stage"].items()}
            w(
                f"| `{r['op']}` | {fmt_time(t['eager'])}{lin.get('eager', '')} | "
                f"{ratio(t, 's2sgrad', 'eager')}{lin.get('s2sgrad', '')} | "
                f"{ratio(t, 'hand', 'eager')}{lin.get('hand', '') if 'hand' in t else ''} | "
                f"{ratio(t, 's2sgrad', 'hand')} |"
            )
        w(
            f"| geomean | | {geomean([r['db']['s2sgrad'] / r['db']['eager'] for r in sel]):.2f} | | |"
        )
    w("")
    if cfg.backend != "none":
        w("## torch.compile")
        w("")
        w(
            f"Backend `{cfg.backend}`, `fullgraph=True` (a graph break would fail the compile and "
            "be listed here, then retried without fullgraph and counted with "
            "`torch._dynamo.explain`). Compile time is the first fwd+bwd call."
        )
        w("")
        w("| op | size | compile (a) | compile (b) | breaks (a) | breaks (b) |")
        w("|---|---|---|---|---|---|")
        for r in rows:
            c = r.get("compile")
            if not c:
                continue
            ea, eb = c["eager"], c["s2sgrad"]
            w(
                f"| `{r['op']}` | {r['size']} | {ea['compile_s']:.1f} s | {eb['compile_s']:.1f} s | "
                f"{ea['breaks']}{' ' + ea['error'] if ea['error'] else ''} | "
                f"{eb['breaks']}{' ' + eb['error'] if eb['error'] else ''} |"
            )
        w("")
    if mem:
        w("## Memory saved for backward")
        w("")
        w(
            f"Bytes of the distinct storages packed by `torch.autograd.graph.saved_tensors_hooks` "
            f"during one forward call at the `{cfg.memory_size}` size (a tensor saved twice, or "
            "a view of one, counts once). `not inputs` leaves out storages that are the op's own "
            "inputs (those the caller keeps alive anyway). `n` is the number of tensors packed. "
            "Ops for which (a) saves nothing (the reductions: only sizes) are left out of the "
            "mean of ratios."
        )
        w("")
        w(
            "| op | (a) eager | n | (b) s2sgrad | n | b/a | (a) not inputs | (b) not inputs | (c) hand |"
        )
        w("|---|---|---|---|---|---|---|---|---|")
        for m in mem:
            a, b = m["eager"], m["s2sgrad"]
            c = m.get("hand")
            rel = f"{b['total'] / a['total']:.2f}" if a["total"] else "–"
            w(
                f"| `{m['op']}` | {fmt_bytes(a['total'])} | {a['tensors']} | {fmt_bytes(b['total'])} | "
                f"{b['tensors']} | {rel} | "
                f"{fmt_bytes(a['not_inputs'])} | "
                f"{fmt_bytes(b['not_inputs'])} | {fmt_bytes(c['total']) if c else '–'} |"
            )
        ta = sum(m["eager"]["total"] for m in mem)
        tb = sum(m["s2sgrad"]["total"] for m in mem)
        w(
            f"| **all ops** | {fmt_bytes(ta)} | | {fmt_bytes(tb)} | | mean {summary['memory_mean_ratio']:.2f}, "
            f"totals {tb / ta:.2f} | {fmt_bytes(sum(m['eager']['not_inputs'] for m in mem))} | "
            f"{fmt_bytes(sum(m['s2sgrad']['not_inputs'] for m in mem))} | |"
        )
        w("")
    w("## Convert speed")
    w("")
    if tool.get("lines_per_s"):
        w(
            "`python benchmarks/convert_speed.py`, on two inputs: the benchmark input, "
            f"`synthetic_module({tool['differentiators']})` ({tool['differentiators']} "
            "differentiators from six templates with varied names and constants, each "
            "with a temporary that backward captures), and `closure_module()`, the "
            "modules of tests/corpus/ joined into one (closure-style rules as people "
            "write them: lists, branches, helpers, comments). **Cold**: `python -m "
            "s2sgrad convert FILE -o DIR` in a fresh interpreter, median of "
            f"{tool['repeats']} runs, with s2sgrad's bytecode and its rule cache "
            "written (as after the first conversion on a machine; the first one is "
            "below the table). **Warm**: `pipeline.convert` in a process that has "
            "converted another module already (what the import hook pays for its second "
            "module; black's memo emptied), best of as many. **`--check`**: `convert "
            "--check` of the output just written, in a fresh interpreter (answered from "
            "the output's header without importing libcst or black). Wall time, start-up "
            "included. In parentheses: the previous run's figure (– where it was not "
            "measured)."
        )
        w("")
        w(
            "| input | source lines | generated lines | cold | cold lines/s | "
            "warm lines/s | `--check` lines/s |"
        )
        w("|---|---|---|---|---|---|---|")
        inputs = {"synthetic": ("benchmark input", tool)}
        if tool.get("closures"):
            inputs["closures"] = ("tests/corpus/ as one module", tool["closures"])
        for key, (label, r) in inputs.items():
            w(
                f"| {label} | {r['source_lines']} | {r['generated_lines']} "
                f"({r['generated_lines'] / r['source_lines']:.1f}x) | "
                f"{r['wall_s']:.2f} s | **{r['lines_per_s']:.0f}** "
                f"({was(prev, f'{key}_lines_per_s', '.0f')}) | "
                f"{r['warm_lines_per_s']:.0f} "
                f"({was(prev, f'{key}_warm_lines_per_s', '.0f')}) | "
                f"**{r['check_lines_per_s']:.0f}** "
                f"({was(prev, f'{key}_check_lines_per_s', '.0f')}) |"
            )
        w("")
        for label, r in inputs.values():
            if r.get("first_run"):
                first = r["first_run"]
                w(
                    f"- {label}, the first conversion after installing (no rule "
                    "cache yet: each rule the module uses is parsed; "
                    f"`convert_speed.first_run`): {first['wall_s']:.2f} s, "
                    f"{first['lines_per_s']:.0f} lines/s"
                )
        for key, (label, r) in inputs.items():
            w(
                f"- {label}: interpreter start and `import s2sgrad.cli` "
                f"{r['startup_s']:.2f} s (the engine, libcst and black, is imported "
                "later, during the conversion); excluding it "
                f"{r['lines_per_s_excluding_startup']:.0f} lines/s; CPU time (user + "
                f"system) of the convert process {r['cpu_s']:.2f} s → "
                f"{r['lines_per_cpu_s']:.0f} lines per CPU-second "
                f"({was(prev, f'{key}_lines_per_cpu_s', '.0f')})"
            )
        w("")
        dirs = tool.get("directories") or {}
        if dirs:
            some = next(iter(dirs.values()))
            w(
                "Several files (`convert_speed.measure_directory`): a directory of "
                "modules, `python -m s2sgrad convert -q SRC -o OUT -j N` in a fresh "
                "interpreter with `-j 1` (in the one process) and `-j 2` (two worker "
                "processes; the default, every core, is two here), interleaved, median "
                f"of {some['repeats']}; then `convert --check SRC -o OUT`. CPU time "
                "includes the workers'. The speed-up is `-j 1`'s wall time over "
                "`-j 2`'s; other processes shared the two cores (see the load above)."
            )
            w("")
            w(
                "| directory | files | source lines | generated lines | `-j 1` | "
                "`-j 2` | speed-up | CPU `-j 1` / `-j 2` | `--check` lines/s |"
            )
            w("|---|---|---|---|---|---|---|---|---|")
            for name, d in dirs.items():
                one, two = d["workers"]["1"], d["workers"]["2"]
                label = DIRECTORY_LABELS.get(name, name).format(files=d["files"])
                w(
                    f"| {label} | {d['files']} | {d['source_lines']} | "
                    f"{d['generated_lines']} | {one['wall_s']:.2f} s, "
                    f"{one['lines_per_s']:.0f} lines/s "
                    f"({was(prev, f'dir_{name}_j1_lines_per_s', '.0f')}) | "
                    f"{two['wall_s']:.2f} s, **{two['lines_per_s']:.0f} lines/s** "
                    f"({was(prev, f'dir_{name}_j2_lines_per_s', '.0f')}) | "
                    f"**{d['speedup']:.2f}x** ({was(prev, f'dir_{name}_speedup')}) | "
                    f"{one['cpu_s']:.2f} / {two['cpu_s']:.2f} s | "
                    f"{d['check_lines_per_s']:.0f} "
                    f"({was(prev, f'dir_{name}_check_lines_per_s', '.0f')}) |"
                )
            w("")
    else:
        w("Not measured in this run.")
        w("")
    size = tool.get("size") if tool else None
    if size:
        w("## Generated code size")
        w("")
        w(
            "`python benchmarks/generated_size.py`: non-blank lines of "
            "`samples/*_grad.py` over non-blank lines of `samples/*.py`. Generated "
            "modules import `s2sgrad.runtime` (`--standalone` copies the parts a module "
            f"uses into it instead); the runtime's {size['runtime_lines']} non-blank "
            "lines are counted once, on their own, and in no module. Per "
            "differentiator: its `f_forward`, `f_backward`, `FFunction`, op (and any "
            "`f_recompute*`) over the source `def`; a module's shared lines (header, "
            "imports, the format check) count in the ratio over samples/ only."
        )
        w("")
        old = (
            ", when every line counted and every module carried the runtime"
            if prev.get("size_old_method")
            else ""
        )
        without = (
            f"; {prev['size_ratio_without_runtime']:.2f} without the runtime"
            if "size_ratio_without_runtime" in prev
            else ""
        )
        w(
            f"- over samples/: {size['generated_lines']} / {size['source_lines']} = "
            f"**{size['ratio']:.2f}** (target <= {TARGETS['size_ratio']}; previous run "
            f"{was(prev, 'size_ratio')}{without}{old})"
        )
        w(
            f"- median per differentiator: **{size['median_per_differentiator']:.2f}** "
            f"over {size['differentiators']} (target <= {TARGETS['size_median']}; "
            f"previous run {was(prev, 'size_median')}); worst "
            f"{size['worst'][1]:.2f} `{size['worst'][0]}`"
        )
        w(
            f"- the runtime, once: {size['runtime_lines']} lines (previous run: "
            f"{was(prev, 'size_runtime_lines', 'd')}"
            + (
                " in all: its text repeated in every module)"
                if prev.get("size_old_method")
                else ")"
            )
        )
        parts, kinds = size.get("parts"), size.get("kinds")
        if parts and kinds:
            n, src = size["differentiators"], size["source_def_lines"]
            total = sum(parts.values())
            w(
                f"- where the differentiators' {total} generated lines go (against "
                f"{src} lines of source `def`s, {total / src:.2f}x), by part: "
                + ", ".join(
                    f"{part} {lines} ({lines / n:.1f} per differentiator)"
                    for part, lines in sorted(parts.items(), key=lambda kv: -kv[1])
                )
                + "; by kind of line: "
                + ", ".join(
                    f"{KIND_LABELS.get(kind, kind)} {lines}"
                    for kind, lines in kinds.items()
                )
            )
        w("")
        per = size.get("per_differentiator") or {}
        if per:
            before = prev.get("size_per_differentiator") or {}
            w("| differentiator | generated / source | previous run |")
            w("|---|---|---|")
            for name, value in per.items():
                w(
                    f"| `{name}` | {value:.2f} | "
                    + (f"{before[name]:.2f}" if name in before else "–")
                    + " |"
                )
            w("")
    compiled = tool.get("compiled") if tool else None
    if compiled:
        w("## Compiled mode (`--compile`)")
        w("")
        w(
            "`python benchmarks/compiled_mode.py`: each sample op converted with "
            "`compile=true`, float32, one thread, medium and large sizes. fwd+bwd against "
            "`torch.compile(closure forward, fullgraph=True)` (default dynamic); double "
            "backward (forward, gradients with create_graph, gradient of their sum) against "
            "eager autograd through the closure, since torch.compile of the closure refuses "
            "double backward. First-call seconds exclude inductor's one-time start-up "
            f"({compiled['startup_s']:.1f} s in this process); graphs are those dynamo "
            "captured for that op and shape."
        )
        w("")
        w(
            f"Geomean: fwd+bwd **{compiled['geomean_fb']:.2f}x** compiled eager (target <= "
            f"{compiled['target_fb']}; previous run {was(prev, 'compiled_mode_fb')}), "
            f"double backward **{compiled['geomean_db']:.2f}x** eager (target <= "
            f"{compiled['target_db']}; previous run {was(prev, 'compiled_mode_db')})."
        )
        w("")
        for line in compiled_mode.markdown(compiled):
            w(line)
        w("")
    forward = tool.get("forward_mode") if tool else None
    if forward:
        w("## Forward mode (`torch.func.jvp`)")
        w("")
        some = next(iter(forward.values()))
        w(
            "`python benchmarks/forward_mode.py SIZE`: `torch.func.jvp` of every sample "
            "op with a tangent for every floating-point input; one torch thread, CPU "
            "time of the calling thread, the variants interleaved in "
            f"{some.get('rounds', 3)} round(s), lowest median kept. **transpose**: the "
            "generated op, whose `jvp` is the transpose of its backward (the "
            "vector-Jacobian product of `g -> backward(g)` at `g = 0`, applied to the "
            "tangent: a backward and a backward of it); **forward**: torch's forward "
            "mode through the closure's own forward statements (what the op's `jvp` "
            "ran before); **vjp**: one reverse-mode vector-Jacobian product of the op, "
            "for scale."
        )
        w("")
        w(
            "Geomean transpose / forward: "
            + "; ".join(
                f"{s} **{r['geomean_transpose_over_forward']:.2f}x** (worst "
                f"{r['max_transpose_over_forward']:.2f}; previous run "
                f"{was(prev, f'forward_mode_{s}')})"
                for s, r in forward.items()
            )
            + "."
        )
        w("")
        w(
            "No faster path is kept. The op's derivative is the user's backward's, "
            "whatever forward computes; torch's forward mode through forward's "
            "statements gives forward's own derivative, which equals it only where "
            "backward is forward's derivative. Nothing proves that at conversion (a "
            "surrogate or straight-through gradient, a clamped or rescaled backward "
            "differ on purpose), so a jvp through forward would be silently wrong for "
            "exactly the rules that are not plain derivatives, and forward mode would "
            "disagree with reverse mode on the same op. The transpose is right for "
            "every op; it costs a backward and a backward of it, as the table shows."
        )
        w("")
        sizes_fm = list(forward)
        w(
            "| op | "
            + " | ".join(
                f"{s} transpose µs | {s} forward µs | {s} t/f | {s} vjp µs"
                for s in sizes_fm
            )
            + " |"
        )
        w("|---|" + "---|---|---|---|" * len(sizes_fm))
        names = [r["name"] for r in forward[sizes_fm[0]]["rows"]]
        by = {s: {r["name"]: r for r in forward[s]["rows"]} for s in sizes_fm}
        for name in names:
            cells = []
            for s in sizes_fm:
                r = by[s].get(name, {})
                f_us = r.get("forward")
                cells.append(
                    f"{r.get('transpose', math.nan):.1f} | "
                    + (f"{f_us:.1f}" if f_us else "–")
                    + " | "
                    + (f"{r['transpose'] / f_us:.2f}" if f_us else "–")
                    + f" | {r.get('vjp', math.nan):.1f}"
                )
            w(f"| `{name}` | " + " | ".join(cells) + " |")
        w("")
    calls = tool.get("per_call") if tool else None
    if calls:
        w("## Per-call cost of the generated op")
        w("")
        w(
            "`python benchmarks/per_call.py`, tiny size, forward only, every floating-point "
            "input requiring grad, one torch thread, CPU time of the calling thread: "
            "`op` is the generated op (its `_apply` skips `Function.apply`'s per-call "
            "`inspect.signature` binding), `apply` the same op through torch's public "
            "`Function.apply`, `math` `f_forward` under `no_grad`. "
            f"Median over ops: the wrapper adds **{calls['median_op_overhead_us']:.1f} µs** "
            f"to the math (previous run "
            f"{was(prev, 'per_call_median_op_overhead_us', '.1f', ' µs')}; through "
            f"`Function.apply`: {calls['median_apply_overhead_us']:.1f} µs, previous run "
            f"{was(prev, 'per_call_median_apply_overhead_us', '.1f', ' µs')}); `_apply` "
            f"saves {calls['median_saved_us']:.1f} µs per call (previous run "
            f"{was(prev, 'per_call_median_saved_us', '.1f', ' µs')})."
        )
        w("")
        before = prev.get("per_call_rows") or {}
        w("| op | op µs | previous run | apply µs | math µs |")
        w("|---|---|---|---|---|")
        for row in calls["rows"]:
            w(
                f"| `{row['name']}` | {row['op']:.1f} | "
                + (f"{before[row['name']]:.1f}" if row["name"] in before else "–")
                + f" | {row['apply']:.1f} | {row['math']:.1f} |"
            )
        w("")
    w(
        "Import hook (`python benchmarks/import_hook.py`, written separately; its output "
        "verbatim; the `hook, cache hit` row's difference to `plain file (.pyc)` is the "
        "overhead):"
    )
    w("")
    if hook.get("output"):
        w("```")
        w(hook["output"])
        w("```")
        if hook.get("overhead_us"):
            w("")
            w(
                f"Worst cached-import overhead: **{max(hook['overhead_us']) / 1000:.3f} "
                f"ms** per module (previous run {was(prev, 'hook_worst_ms', '.3f', ' ms')})."
            )
    else:
        w(f"Not measured: {hook.get('status', 'skipped')}.")
    w("")
    w("## Per-call overhead (tiny size)")
    w("")
    w(
        "At the tiny size the tensor math is negligible, so time minus the floor (d) is the "
        "autograd machinery. Differences in µs; `previous run` is (b) − (d) of the "
        "previous run."
    )
    w("")
    before = prev.get("tiny_wrapper_us") or {}
    w(
        "| op | (a) − (d) | (b) − (d) | previous run | (c) − (d) | (b) − (c) | "
        "double (b) − (a) |"
    )
    w("|---|---|---|---|---|---|---|")
    tiny = [r for r in rows if r["size"] == "tiny"]
    for r in tiny:
        t, d = r["fb"], r["db"]
        us = lambda x: f"{x * 1e6:+.1f}"  # noqa: E731
        w(
            f"| `{r['op']}` | {us(t['eager'] - t['floor'])} | {us(t['s2sgrad'] - t['floor'])} | "
            + (f"{before[r['op']]:+.1f}" if r["op"] in before else "–")
            + f" | {us(t['hand'] - t['floor']) if 'hand' in t else '–'} | "
            f"{us(t['s2sgrad'] - t['hand']) if 'hand' in t else '–'} | {us(d['s2sgrad'] - d['eager'])} |"
        )
    if tiny:
        median_now = statistics.median(
            (r["fb"]["s2sgrad"] - r["fb"]["floor"]) * 1e6 for r in tiny
        )
        median_before = f"{statistics.median(before.values()):+.1f}" if before else "–"
        w(f"| median | | {median_now:+.1f} | {median_before} | | | |")
    w("")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(QUICK_OPS)} ops, tiny and medium, aot_eager, short timings, "
        "small convert input; prints the report, writes nothing unless --out",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report path (default benchmarks/RESULTS.md; none with --quick)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument(
        "--backend",
        default=None,
        help='torch.compile backend: inductor (default), aot_eager, or "none" to skip',
    )
    p.add_argument(
        "--ops", default=None, help="comma-separated op names to run (default all)"
    )
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated sizes (default tiny,medium,large)",
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="interleaved timing rounds (default 5)"
    )
    p.add_argument(
        "--min-run-time",
        type=float,
        default=None,
        help="blocked_autorange min_run_time in s (default 0.1)",
    )
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default=None,
        help="cpu: the calling thread's CPU time (time.thread_time; default with "
        "--threads 1, immune to other processes on the machine); wall: "
        "time.perf_counter (default with more threads)",
    )
    p.add_argument("--memory-size", default="medium", help="size for the memory table")
    p.add_argument(
        "--convert-n",
        type=int,
        default=None,
        help="differentiators in the synthetic convert input (default 240; 0 skips)",
    )
    p.add_argument(
        "--no-import-hook", action="store_true", help="skip benchmarks/import_hook.py"
    )
    p.add_argument(
        "--no-compiled-mode",
        action="store_true",
        help="skip benchmarks/compiled_mode.py (compile=true against torch.compile)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the raw numbers here (default benchmarks/results.json)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="measure nothing: render the report from raw numbers written by --json",
    )
    cfg = p.parse_args(argv)
    q = cfg.quick
    cfg.backend = cfg.backend or ("aot_eager" if q else "inductor")
    cfg.sizes = (cfg.sizes or ("tiny,medium" if q else "tiny,medium,large")).split(",")
    cfg.rounds = cfg.rounds or (1 if q else 5)
    cfg.clock = cfg.clock or ("cpu" if cfg.threads == 1 else "wall")
    cfg.min_run_time = cfg.min_run_time or (0.05 if q else 0.1)
    cfg.convert_n = (20 if q else 240) if cfg.convert_n is None else cfg.convert_n
    if cfg.out is None and not q:
        cfg.out = ROOT / "benchmarks" / "RESULTS.md"
    if cfg.json is None and not q and not cfg.from_json:
        cfg.json = ROOT / "benchmarks" / "results.json"
    return cfg


def load_previous(path: Path) -> dict[str, Any]:
    """The headline `figures` of the run whose raw numbers are at `path` (read before
    this run overwrites them); empty where there are none."""
    try:
        return figures(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def render_saved(path: Path, out: Path | None) -> int:
    """Re-render a report (e.g. after editing notes.md) from a run's raw numbers."""
    saved = json.loads(path.read_text())
    cfg = argparse.Namespace(**saved["config"])
    text = report(
        cfg,
        saved["runtime"],
        saved["memory"],
        saved["convert"],
        saved["import_hook"],
        saved["elapsed_s"],
        saved["machine"],
        saved["date"],
        saved.get("previous"),
    )
    print(text)
    if out:
        out.write_text(text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    if cfg.from_json:
        return render_saved(cfg.from_json, cfg.out)
    torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    load_start = "{:.2f} / {:.2f} / {:.2f}".format(*os.getloadavg())

    loads: list[float] = []

    def log(msg: str) -> None:
        loads.append(os.getloadavg()[0])
        print(
            f"[{time.perf_counter() - started:7.1f}s] {msg}",
            file=sys.stderr,
            flush=True,
        )

    previous = load_previous(cfg.json or ROOT / "benchmarks" / "results.json")
    ops = discover()
    missing = [f"{m}.{n}" for m, n in ops if (m, n) not in cases.FACTORIES]
    if missing:
        log(
            f"no input factory for {', '.join(missing)}: skipped (add one in benchmarks/cases.py)"
        )
    ops = [(m, n) for m, n in ops if (m, n) in cases.FACTORIES]
    wanted = set(cfg.ops.split(",")) if cfg.ops else (QUICK_OPS if cfg.quick else None)
    if wanted:
        ops = [(m, n) for m, n in ops if n in wanted]
    log(
        f"{len(ops)} ops x {len(cfg.sizes)} sizes, threads={cfg.threads}, backend={cfg.backend}"
    )

    rows = []
    for size in cases.SIZES:
        if size not in cfg.sizes:
            continue
        log(f"runtime, size {size}")
        for module, name in ops:
            try:
                rows.append(run_case(build_case(module, name, size), cfg, log))
            except Exception:
                log(f"  {name} {size} FAILED:\n{traceback.format_exc()}")
                raise
            gc.collect()
    log(f"memory at {cfg.memory_size}")
    mem = memory_rows(ops, cfg.memory_size)
    tool: dict[str, Any] = {}
    if cfg.convert_n:
        log(f"convert speed, {cfg.convert_n} differentiators")
        tool = convert_speed.measure(
            cfg.convert_n, repeats=1 if cfg.quick else 3, budget_s=60
        )
    tool["size"] = generated_size.measure()
    log("per-call cost")
    tool["per_call"] = per_call.measure(rounds=1 if cfg.quick else 3)
    tool["forward_mode"] = {}
    for size in ("tiny", "medium"):
        log(f"forward mode, size {size}")
        rounds = 1 if cfg.quick else 3
        tool["forward_mode"][size] = {
            **forward_mode.measure(size, rounds=rounds),
            "rounds": rounds,
        }
    if not cfg.no_compiled_mode:
        log("compiled mode (compile=true)")
        tool["compiled"] = compiled_mode.measure(quick=cfg.quick, log=log)
    hook = {"status": "skipped"} if cfg.no_import_hook else import_hook_overhead(log)
    elapsed = time.perf_counter() - started
    machine_lines = machine(cfg.threads, load_start, loads)
    date = datetime.date.today().isoformat()
    if cfg.json:  # first, so that a report that fails to render loses no measurement
        cfg.json.write_text(
            json.dumps(
                {
                    "config": {
                        k: (str(v) if isinstance(v, Path) else v)
                        for k, v in vars(cfg).items()
                    },
                    "runtime": rows,
                    "memory": mem,
                    "convert": tool,
                    "import_hook": hook,
                    "elapsed_s": elapsed,
                    "machine": machine_lines,
                    "date": date,
                    "previous": previous,
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
        log(f"wrote {cfg.json}")
    text = report(cfg, rows, mem, tool, hook, elapsed, machine_lines, date, previous)
    print(text)
    if cfg.out:
        cfg.out.write_text(text + "\n")
        log(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
