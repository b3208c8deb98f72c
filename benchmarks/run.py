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
    compiled_mode,  # noqa: E402
    convert_speed,  # noqa: E402
    generated_size,  # noqa: E402
    handwritten,
    per_call,  # noqa: E402
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
QUICK_OPS = {"mul", "add_mul", "layer_norm", "softmax", "mean_var"}
TARGETS = {
    "hand": 1.05,
    "eager": 0.9,
    "memory": 0.6,
    "compile": 1.1,
    "convert_lines_per_s": 1000.0,
    "convert_goal_lines_per_s": 2000.0,
    "check_lines_per_s": 20000.0,
    "size_ratio": 3.5,
    "size_median": 4.0,
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


def machine(threads: int, load_start: str) -> list[str]:
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
        " (other work shared the machine during the run)",
    ]


def mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def targets_table(summary: dict[str, Any]) -> list[str]:
    lines = ["| target | measured | met |", "|---|---|---|"]
    for label, measured, met in summary["targets"]:
        verdict = (
            {True: "yes", False: "**no**", None: "n/a"}.get(met, met)
            if not isinstance(met, str)
            else f"**{met}**"
        )
        lines.append(f"| {label} | {measured} | {verdict} |")
    return lines


def summarize(
    rows: list[dict[str, Any]],
    mem: list[dict[str, Any]],
    tool: dict[str, Any],
    hook: dict[str, Any],
    sizes: Sequence[str],
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
                (met and not breaks and not slow)
                or ("partly" if met and not breaks else False),
            )
        )
    if tool:
        t.append(
            (
                f"`s2sgrad convert` >= {TARGETS['convert_lines_per_s']:.0f} source lines/s "
                f"(cold; goal {TARGETS['convert_goal_lines_per_s']:.0f})",
                f"{tool['lines_per_s']:.0f} lines/s ({tool['source_lines']} lines, "
                f"{tool['differentiators']} differentiators, {tool['wall_s']:.1f} s)",
                tool["lines_per_s"] >= TARGETS["convert_lines_per_s"],
            )
        )
        if "check_lines_per_s" in tool:
            t.append(
                (
                    f"`s2sgrad convert --check`, outputs up to date, >= "
                    f"{TARGETS['check_lines_per_s']:.0f} source lines/s",
                    f"{tool['check_lines_per_s']:.0f} lines/s "
                    f"({tool['check_wall_s'] * 1000:.0f} ms, start-up included)",
                    tool["check_lines_per_s"] >= TARGETS["check_lines_per_s"],
                )
            )
    compiled = tool.get("compiled") if tool else None
    if compiled:
        t.append(
            (
                f"`--compile` fwd+bwd / torch.compile of the closure <= "
                f"{compiled['target_fb']} (geomean)",
                f"{compiled['geomean_fb']:.2f} over {len(compiled['rows'])} op-sizes",
                compiled["geomean_fb"] <= compiled["target_fb"],
            )
        )
        t.append(
            (
                f"`--compile` double backward / eager <= {compiled['target_db']} "
                "(geomean)",
                f"{compiled['geomean_db']:.2f}",
                compiled["geomean_db"] <= compiled["target_db"],
            )
        )
    size = tool.get("size") if tool else None
    if size:
        t.append(
            (
                f"generated / source lines over samples/ <= {TARGETS['size_ratio']}, "
                f"median per differentiator <= {TARGETS['size_median']}",
                f"{size['ratio']:.2f} ({size['generated_lines']} / {size['source_lines']}; "
                f"{size['ratio_without_runtime']:.2f} without the shared runtime); "
                f"median {size['median_per_differentiator']:.2f} "
                f"(worst {size['worst'][1]:.1f} `{size['worst'][0]}`)",
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
                worst / 1000 < TARGETS["import_overhead_ms"],
            )
        )
    elif hook:
        t.append(
            (
                "import hook cached import overhead < 1 ms",
                f"not measured ({hook.get('status')})",
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
) -> str:
    sizes = [s for s in cases.SIZES if s in cfg.sizes]
    summary = summarize(rows, mem, tool, hook, sizes)
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
    out.extend(targets_table(summary))
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
    w("## Tool speed")
    w("")
    if tool:
        w(
            f"`python -m s2sgrad convert synthetic_ops.py -o DIR` in a fresh interpreter on a "
            f"generated module of {tool['differentiators']} differentiators ({tool['source_lines']} "
            f"source lines, six templates with varied names and constants, each with a temporary "
            f"that backward captures; `benchmarks/convert_speed.py`), median of {tool['repeats']} "
            "cold runs:"
        )
        w("")
        w(
            f"- wall time {tool['wall_s']:.2f} s → **{tool['lines_per_s']:.0f} source lines/s** "
            f"({tool['generated_lines']} lines generated)"
        )
        w(
            f"- of which interpreter start and `import s2sgrad.cli`: {tool['startup_s']:.2f} s; "
            f"excluding it {tool['lines_per_s_excluding_startup']:.0f} lines/s"
        )
        w(
            f"- CPU time (user + system) of the convert process {tool['cpu_s']:.2f} s "
            f"(start-up {tool['startup_cpu_s']:.2f} s) → {tool['lines_per_cpu_s']:.0f} lines per "
            "CPU-second (wall time on a shared machine includes waiting for a core)"
        )
        if "check_lines_per_s" in tool:
            w(
                f"- `convert --check` of the output just written: {tool['check_wall_s']:.3f} s "
                f"→ **{tool['check_lines_per_s']:.0f} source lines/s**, answered from the "
                "output's header without importing the engine (libcst, black)"
            )
    else:
        w("Not measured in this run.")
    w("")
    size = tool.get("size") if tool else None
    if size:
        w("## Generated code size")
        w("")
        w(
            "`python benchmarks/generated_size.py`: lines of `samples/*_grad.py` over lines "
            "of `samples/*.py`. Per differentiator, `f_forward`, `f_backward`, `FFunction` "
            "and the op (each with the blank lines after it) over the source `def`; the "
            "module's shared lines (header, imports, aliases, helpers) are left out of the "
            "per-differentiator numbers and counted in the total."
        )
        w("")
        w(
            f"- over samples/: {size['generated_lines']} / {size['source_lines']} = "
            f"**{size['ratio']:.2f}**; of those lines, {size['runtime_lines']} are the "
            "runtime every module carries (Function.apply without signature binding, "
            "forward mode), the same text in each: without it "
            f"{size['ratio_without_runtime']:.2f}"
        )
        w(
            f"- median per differentiator: **{size['median_per_differentiator']:.2f}** "
            f"over {size['differentiators']} (worst {size['worst'][1]:.1f}, "
            f"`{size['worst'][0]}`)"
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
            f"{compiled['target_fb']}), double backward **{compiled['geomean_db']:.2f}x** "
            f"eager (target <= {compiled['target_db']})."
        )
        w("")
        for line in compiled_mode.markdown(compiled):
            w(line)
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
            f"to the math (through `Function.apply`: {calls['median_apply_overhead_us']:.1f} "
            f"µs); `_apply` saves {calls['median_saved_us']:.1f} µs per call."
        )
        w("")
        w("| op | op µs | apply µs | math µs |")
        w("|---|---|---|---|")
        for row in calls["rows"]:
            w(
                f"| `{row['name']}` | {row['op']:.1f} | {row['apply']:.1f} | "
                f"{row['math']:.1f} |"
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
    else:
        w(f"Not measured: {hook.get('status', 'skipped')}.")
    w("")
    w("## Per-call overhead (tiny size)")
    w("")
    w(
        "At the tiny size the tensor math is negligible, so time minus the floor (d) is the "
        "autograd machinery. Differences in µs:"
    )
    w("")
    w("| op | (a) − (d) | (b) − (d) | (c) − (d) | (b) − (c) | double (b) − (a) |")
    w("|---|---|---|---|---|---|")
    for r in rows:
        if r["size"] != "tiny":
            continue
        t, d = r["fb"], r["db"]
        us = lambda x: f"{x * 1e6:+.1f}"  # noqa: E731
        w(
            f"| `{r['op']}` | {us(t['eager'] - t['floor'])} | {us(t['s2sgrad'] - t['floor'])} | "
            f"{us(t['hand'] - t['floor']) if 'hand' in t else '–'} | "
            f"{us(t['s2sgrad'] - t['hand']) if 'hand' in t else '–'} | {us(d['s2sgrad'] - d['eager'])} |"
        )
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

    def log(msg: str) -> None:
        print(
            f"[{time.perf_counter() - started:7.1f}s] {msg}",
            file=sys.stderr,
            flush=True,
        )

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
    if not cfg.no_compiled_mode:
        log("compiled mode (compile=true)")
        tool["compiled"] = compiled_mode.measure(quick=cfg.quick, log=log)
    hook = {"status": "skipped"} if cfg.no_import_hook else import_hook_overhead(log)
    elapsed = time.perf_counter() - started
    machine_lines = machine(cfg.threads, load_start)
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
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
        log(f"wrote {cfg.json}")
    text = report(cfg, rows, mem, tool, hook, elapsed, machine_lines, date)
    print(text)
    if cfg.out:
        cfg.out.write_text(text + "\n")
        log(f"wrote {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
