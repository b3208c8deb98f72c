"""Measure what the import hook adds to importing a generated module, per import.

Copies samples into two packages under a temporary folder: `hooked/` holds only the
sources, served by the hook from its warm cache; `plain/` also holds each generated
module as a file, compiled to a warm `.pyc` by Python's own importer. Each import is
timed with `time.perf_counter` after removing the module from `sys.modules` (the source
module and torch stay imported), so the numbers are import machinery plus executing the
module body. Run from the repository root: `python benchmarks/import_hook.py`.
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401 - imported once up front, as every generated module needs it

import s2sgrad

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
NAMES = ["temporary", "softmax", "attention", "normalization"]
ROUNDS = 2000


def time_import(name: str) -> tuple[float, float]:
    """Return the wall and CPU seconds of one fresh import of `name`."""
    del sys.modules[name]
    wall, cpu = time.perf_counter(), time.process_time()
    importlib.import_module(name)
    return time.perf_counter() - wall, time.process_time() - cpu


def setup(root: Path) -> None:
    for package in ("hooked", "plain"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
        for name in NAMES:
            shutil.copy(SAMPLES / f"{name}.py", root / package / f"{name}.py")
    for name in NAMES:
        source = (root / "plain" / f"{name}.py").read_text()
        text = s2sgrad.transform(source, f"plain/{name}.py", f"plain.{name}")
        (root / "plain" / f"{name}_grad.py").write_text(text)


def main() -> None:
    sys.dont_write_bytecode = False  # both sides need their caches written once
    root = Path(tempfile.mkdtemp(prefix="s2sgrad-bench-"))
    sys.path.insert(0, str(root))
    try:
        setup(root)
        with s2sgrad.install_import_hook():
            measure(root)
    finally:
        shutil.rmtree(root)


def measure(root: Path) -> None:
    """Time the three ways in turn, round by round, so that they share the noise."""
    variants = {
        "plain file (.pyc)": "plain.{}_grad",
        "hook, cache hit": "hooked.{}_grad",
        "hook, fresh file as is": "plain.{}_grad",
    }
    print(f"{ROUNDS} fresh imports per module and way, Python {sys.version.split()[0]}")
    for name in NAMES:
        importlib.import_module(f"plain.{name}_grad")  # warm the .pyc and the source
        start = time.perf_counter()
        importlib.import_module(f"hooked.{name}_grad")
        print(
            f"  first import, generated: {name:<14} {time.perf_counter() - start:.3f} s"
        )
    hook = sys.meta_path.pop(0)  # the plain way runs without the hook
    for name in NAMES:
        times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for variant, pattern in variants.items():
                if variant != "plain file (.pyc)":
                    sys.meta_path.insert(0, hook)
                times[variant].append(time_import(pattern.format(name)))
                if variant != "plain file (.pyc)":
                    sys.meta_path.remove(hook)
        walls = {v: statistics.median(w for w, _ in t) for v, t in times.items()}
        cpus = {v: statistics.median(c for _, c in t) for v, t in times.items()}
        base_wall, base_cpu = walls["plain file (.pyc)"], cpus["plain file (.pyc)"]
        for variant in variants:
            print(
                f"  {name:<14} {variant:<24} median wall {walls[variant] * 1e6:7.1f} us "
                f"({(walls[variant] - base_wall) * 1e6:+7.1f})   "
                f"cpu {cpus[variant] * 1e6:7.1f} us ({(cpus[variant] - base_cpu) * 1e6:+7.1f})"
            )
    sys.meta_path.insert(0, hook)


if __name__ == "__main__":
    main()
