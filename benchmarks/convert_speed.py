"""Tool speed: `s2sgrad convert` throughput on a generated module, in a fresh process.

`synthetic_module(n)` writes `n` differentiators by cycling through a few templates with
varied names and constants; every one has a temporary that backward captures (so each is
lifted, promoted and gets generated VJP code). `closure_module()` is closure-style code
as people write it: the modules of tests/corpus/ joined into one (817 lines of rules
with lists, branches, helpers and comments). `measure` times
`python -m s2sgrad convert FILE -o DIR` in a new interpreter each time (cold: nothing of
s2sgrad is imported yet; Python's bytecode cache is in its normal state) and also the
bare start-up (`python -c "import s2sgrad.cli"`) so the report can show both, and
`convert --check` of the output just written (up to date: answered from its header).
Warm is `pipeline.convert` in a process that has converted another module already
(what the import hook pays for its second module), black's memo of formatted pieces
emptied first; the best of the repeats.

`measure_directory` converts a directory of several modules with `-j 1` (in the one
process) and with `-j 2` (two worker processes), interleaved, and then
`convert --check` of the directory: `synthetic_modules(n, k)` splits the benchmark
input into `k` modules, `corpus_modules()` is tests/corpus/ as its separate files.

Run directly for a quick look: `python benchmarks/convert_speed.py [N]`.
"""

from __future__ import annotations

import compileall
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEADER = '''"""Synthetic differentiators for the s2sgrad convert benchmark (generated)."""
import torch

'''

TEMPLATES = [
    '''
def tanh_gate_{i}(x: torch.Tensor, y: torch.Tensor):
    """tanh({c} * x) * y; backward reads the temporary t."""
    t = torch.tanh(x * {c})
    def backward(grad):
        return grad * y * (1 - t * t) * {c}, grad * t
    return t * y, backward
''',
    '''
def sq_dist_{i}(x: torch.Tensor, y: torch.Tensor, scale: float = {c}):
    """scale * ||x - y||^2; backward reads the difference d."""
    d = x - y
    def backward(grad):
        g = 2.0 * scale * grad * d
        return g, -g, None
    return scale * (d * d).sum(), backward
''',
    '''
def exp_scale_{i}(x: torch.Tensor, w: torch.Tensor):
    """exp(x) * w; backward reads e = exp(x)."""
    e = torch.exp(x)
    def backward(grad):
        return grad * w * e, (grad * e).sum_to_size(w.shape)
    return e * w, backward
''',
    '''
def swish_{i}(x: torch.Tensor, *, beta: float = {c}):
    """x * sigmoid(beta * x); backward reads s."""
    s = torch.sigmoid(beta * x)
    def backward(grad):
        return grad * (s + beta * x * s * (1 - s)), None
    return x * s, backward
''',
    '''
def rms_{i}(x: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6):
    """RMS norm; backward reads rstd and x_hat."""
    rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    x_hat = x * rstd
    def backward(grad):
        g = grad * weight
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return grad_x, (grad * x_hat).sum_to_size(weight.shape), None
    return x_hat * weight, backward
''',
    '''
def affine_tanh_{i}(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    """tanh(x @ w + b); backward reads the activation a."""
    a = torch.tanh(x @ w + b)
    def backward(grad):
        grad_h = grad * (1 - a * a)
        return grad_h @ w.t(), x.t() @ grad_h, grad_h.sum(0)
    return a * {c}, backward
''',
]


CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"


def closure_module() -> str:
    """The modules of tests/corpus/ as one module: their imports first, then each
    module's code in turn (their function names are distinct)."""
    imports: set[str] = set()
    bodies = []
    for path in sorted(CORPUS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        lines = path.read_text().splitlines()
        imports.update(line for line in lines if line.startswith(("import ", "from ")))
        bodies.append(
            "\n".join(
                line for line in lines if not line.startswith(("import ", "from "))
            )
        )
    return "\n".join(sorted(imports)) + "\n\n" + "\n\n".join(bodies)


def synthetic_module(n: int) -> str:
    """Source text of a module with `n` differentiators, each with a captured temporary."""
    parts = [HEADER]
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        parts.append(template.format(i=i, c=round(0.5 + (i % 7) * 0.25, 2)))
    return "\n".join(parts)


def synthetic_modules(n: int, files: int) -> dict[str, str]:
    """The `n` differentiators of `synthetic_module(n)` spread over `files` modules
    (each with its own header), keyed by module name."""
    modules: dict[str, list[str]] = {}
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        modules.setdefault(f"synthetic_{i % files}", []).append(
            template.format(i=i, c=round(0.5 + (i % 7) * 0.25, 2))
        )
    return {name: "\n".join([HEADER, *parts]) for name, parts in modules.items()}


def corpus_modules() -> dict[str, str]:
    """The modules of tests/corpus/, each as it is, keyed by module name."""
    return {
        path.stem: path.read_text()
        for path in sorted(CORPUS.glob("*.py"))
        if path.name != "__init__.py"
    }


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of running cmd to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


#: Run in a fresh interpreter: convert a small module, then time `argv[1]` (best of
#: argv[2] runs, black's memo emptied before each); prints the seconds.
_WARM = """
import sys, time
from pathlib import Path
from s2sgrad.codegen import fmt
from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.pipeline import convert

convert(sys.argv[3], Origin("warm_up.py", "warm_up"), Options())
path = Path(sys.argv[1])
source, best = path.read_text(), float("inf")
for _ in range(int(sys.argv[2])):
    fmt._format_piece.cache_clear()
    start = time.perf_counter()
    convert(source, Origin(path.name, path.stem), Options())
    best = min(best, time.perf_counter() - start)
print(best)
"""


def _warm(source: Path, repeats: int, cwd: Path) -> float:
    """Seconds of the best warm conversion of `source` (see `_WARM`)."""
    warm_up = synthetic_module(6)
    proc = subprocess.run(
        [sys.executable, "-c", _WARM, str(source), str(repeats), warm_up],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"warm conversion failed:\n{proc.stderr[-2000:]}")
    return float(proc.stdout.split()[-1])


def measure(n: int = 240, repeats: int = 3, budget_s: float = 120.0) -> dict[str, Any]:
    """Time cold and warm conversions of a synthetic module of `n` differentiators,
    and of `closure_module()` (under "closures"); then `-j 1` against `-j 2` on the
    synthetic differentiators spread over 8 modules (4 below 80 differentiators) and
    on tests/corpus/'s modules (under "directories").

    Runs `repeats` conversions, or fewer once they have taken `budget_s` in all.
    s2sgrad's bytecode is compiled first, as installing a package compiles it: where
    `PYTHONDONTWRITEBYTECODE` is set, a module changed since its last `.pyc` would
    otherwise be compiled again in every timed process. Then each input is converted
    once as the first conversion after installing (`first_run`: no rule cache yet),
    and the rule cache is built as that first conversion builds it where Python
    writes bytecode (`prime_rule_cache`); the timed runs find it, as every later
    conversion on the machine does.
    """
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "s2sgrad", quiet=1)
    first = {
        "synthetic": first_run(synthetic_module(n), "synthetic_ops"),
        "closures": first_run(closure_module(), "closure_ops"),
    }
    prime_rule_cache()
    result: dict[str, Any] = {
        "differentiators": n,
        **measure_source(synthetic_module(n), "synthetic_ops", repeats, budget_s),
        "first_run": first["synthetic"],
    }
    result["closures"] = measure_source(
        closure_module(), "closure_ops", repeats, budget_s
    )
    result["closures"]["first_run"] = first["closures"]
    files = 8 if n >= 80 else 4
    result["directories"] = {
        "synthetic": measure_directory(synthetic_modules(n, files), repeats, budget_s),
        "corpus": measure_directory(corpus_modules(), repeats, budget_s),
    }
    return result


def _rule_cache_entries() -> list[Path]:
    """The rule cache entries of this checkout (`s2sgrad.autodiff.registry`)."""
    folder = Path(__file__).resolve().parent.parent / "s2sgrad" / "autodiff"
    return sorted((folder / "__pycache__").glob("rules.*.s2sgrad-rules"))


def first_run(text: str, stem: str) -> dict[str, Any]:
    """One cold conversion of `text` as the very first conversion after installing:
    no rule cache yet (each rule the module uses is parsed). Nothing is written."""
    for entry in _rule_cache_entries():
        entry.unlink()
    with tempfile.TemporaryDirectory(prefix="s2sgrad-bench-first-") as tmp:
        root = Path(tmp)
        source = root / f"{stem}.py"
        source.write_text(text)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        cmd = [sys.executable, "-m", "s2sgrad", "convert", str(source), "-o", "out"]
        wall, cpu = _run(cmd, root, env)
    lines = len(text.splitlines())
    return {"wall_s": wall, "cpu_s": cpu, "lines_per_s": lines / wall}


def prime_rule_cache() -> None:
    """Build the rule cache as the first conversion on a machine does (where Python
    writes bytecode), so that the timed runs find it, as later conversions do."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    code = "from s2sgrad.autodiff.registry import builtin_registry; builtin_registry()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    if not _rule_cache_entries():
        raise RuntimeError("s2sgrad wrote no rule cache; is its folder writable?")


def measure_directory(
    modules: dict[str, str],
    repeats: int = 3,
    budget_s: float = 120.0,
    workers: tuple[int, ...] = (1, 2),
) -> dict[str, Any]:
    """Convert a directory of `modules` with each `-j` of `workers` in a fresh process
    (the settings interleaved, `repeats` rounds or fewer once they took `budget_s`),
    then `convert --check` the directory against the outputs just written."""
    with tempfile.TemporaryDirectory(prefix="s2sgrad-bench-dir-") as tmp:
        root = Path(tmp)
        src = root / "src"
        src.mkdir()
        for name, text in modules.items():
            (src / f"{name}.py").write_text(text)
        lines = sum(len(text.splitlines()) for text in modules.values())
        walls: dict[int, list[float]] = {j: [] for j in workers}
        cpus: dict[int, list[float]] = {j: [] for j in workers}
        check_times: list[float] = []
        spent = 0.0
        for k in range(repeats):
            for j in workers:
                out = root / f"out{k}_j{j}"
                wall, cpu = _run(
                    [sys.executable, "-m", "s2sgrad", "convert", "-q", str(src)]
                    + ["-o", str(out), "-j", str(j)],
                    root,
                )
                walls[j].append(wall)
                cpus[j].append(cpu)
                spent += wall
            wall, _ = _run(
                [sys.executable, "-m", "s2sgrad", "convert", "--check", "-q"]
                + [str(src), "-o", str(out)],
                root,
            )
            check_times.append(wall)
            if spent > budget_s:
                break
        produced = sorted(out.rglob("*_grad.py"))
        if len(produced) != len(modules):
            raise RuntimeError(f"convert wrote {len(produced)} of {len(modules)}")
        generated_lines = sum(len(p.read_text().splitlines()) for p in produced)
    per: dict[str, Any] = {}
    for j in workers:
        wall = statistics.median(walls[j])
        per[str(j)] = {
            "wall_s": wall,
            "cpu_s": statistics.median(cpus[j]),
            "lines_per_s": lines / wall,
        }
    check = statistics.median(check_times)
    return {
        "files": len(modules),
        "source_lines": lines,
        "generated_lines": generated_lines,
        "repeats": len(check_times),
        "workers": per,
        "speedup": per[str(workers[0])]["wall_s"] / per[str(workers[-1])]["wall_s"],
        "check_wall_s": check,
        "check_lines_per_s": lines / check,
    }


def measure_source(
    text: str, stem: str, repeats: int = 3, budget_s: float = 120.0
) -> dict[str, Any]:
    """Time cold and warm conversions of the module `text` (see `measure`)."""
    with tempfile.TemporaryDirectory(prefix="s2sgrad-bench-") as tmp:
        root = Path(tmp)
        source = root / f"{stem}.py"
        source.write_text(text)
        lines = len(source.read_text().splitlines())
        convert_times, convert_cpu, startup_times, startup_cpu = [], [], [], []
        check_times: list[float] = []
        for k in range(repeats):
            out = root / f"out{k}"
            wall, cpu = _run(
                [
                    sys.executable,
                    "-m",
                    "s2sgrad",
                    "convert",
                    str(source),
                    "-o",
                    str(out),
                ],
                root,
            )
            convert_times.append(wall)
            convert_cpu.append(cpu)
            produced = list(out.rglob("*_grad.py"))
            if len(produced) != 1:
                raise RuntimeError(f"convert wrote {produced}, expected one *_grad.py")
            wall, _ = _run(
                [sys.executable, "-m", "s2sgrad", "convert", "--check", str(source)]
                + ["-o", str(out)],
                root,
            )
            check_times.append(wall)
            wall, cpu = _run([sys.executable, "-c", "import s2sgrad.cli"], root)
            startup_times.append(wall)
            startup_cpu.append(cpu)
            if sum(convert_times) > budget_s:
                break
        generated_lines = len(produced[0].read_text().splitlines())
        warm = _warm(source, len(convert_times), root)
    wall = statistics.median(convert_times)
    startup = statistics.median(startup_times)
    cpu = statistics.median(convert_cpu)
    cpu_startup = statistics.median(startup_cpu)
    return {
        "source_lines": lines,
        "generated_lines": generated_lines,
        "wall_s": wall,
        "startup_s": startup,
        "lines_per_s": lines / wall,
        "lines_per_s_excluding_startup": lines / max(wall - startup, 1e-9),
        "cpu_s": cpu,
        "startup_cpu_s": cpu_startup,
        "lines_per_cpu_s": lines / cpu,
        "repeats": len(convert_times),
        # `convert --check` of the output just written: answered from its header.
        "check_wall_s": statistics.median(check_times),
        "check_lines_per_s": lines / statistics.median(check_times),
        "warm_s": warm,
        "warm_lines_per_s": lines / warm,
    }


def _show(result: dict[str, Any], indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _show(value, indent + "  ")
        else:
            shown = f"{value:.3f}" if isinstance(value, float) else value
            print(f"{indent}{key}: {shown}")


if __name__ == "__main__":
    _show(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 240))
