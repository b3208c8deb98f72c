"""Where `s2sgrad convert` spends its time, stage by stage.

    python benchmarks/convert_profile.py [N]        # synthetic, N differentiators (240)
    python benchmarks/convert_profile.py closures   # tests/corpus/ as one module
    python benchmarks/convert_profile.py PATH.py    # any module

Runs the same pipeline as the CLI (`s2sgrad.pipeline.convert`) in this fresh process,
with timers wrapped around its stages: importing s2sgrad, parsing s2sgrad's own rule
module (`builtin_registry`, once per process), parsing the user module, checking
forward's values and in-place writes, lifting, differentiating (VJP planning), code
generation of the definitions and, inside it, black (one pass per top-level
definition; the fixed-point check of `codegen/guard.py` runs in the tests only), and
assembling the module. All in this one process, as `-j 1` and the import hook run
it: under `-j N` the CLI lifts, differentiates and generates in forked processes.
CPU seconds (`time.process_time`), so that other load on the machine does not
count. For the
functions under a stage, run it under a profiler (pyinstrument gives a readable tree).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOTALS: dict[str, float] = defaultdict(float)
COUNTS: dict[str, int] = defaultdict(int)


def timed(name: str, fn):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.process_time() - start
            COUNTS[name] += 1

    return wrapper


def main(which: str) -> None:
    start = time.process_time()
    import s2sgrad.cli  # noqa: F401  (what the CLI imports)
    from s2sgrad import pipeline
    from s2sgrad.autodiff import plan, registry
    from s2sgrad.codegen import fmt, guard

    import_s = time.process_time() - start

    from benchmarks.convert_speed import closure_module, synthetic_module
    from s2sgrad.header import Origin
    from s2sgrad.options import Options

    registry.builtin_registry.cache_clear()
    plan.builtin_registry = timed(
        "parse s2sgrad's rules (builtin_registry)", registry.builtin_registry
    )
    pipeline.parse = timed("parse user module", pipeline.parse)
    pipeline._judge_forward = timed(  # type: ignore[attr-defined]
        "check forward (values, in-place writes)",
        pipeline._judge_forward,  # type: ignore[attr-defined]
    )
    pipeline.lift = timed("lift", pipeline.lift)
    pipeline.differentiate = timed(
        "differentiate (incl. rules parse)", pipeline.differentiate
    )
    pipeline.part = timed("generate definitions (incl. black)", pipeline.part)
    pipeline.assemble = timed("assemble the module (imports, guard)", pipeline.assemble)
    import s2sgrad.codegen as codegen

    codegen.format_pieces = timed("black: format generated code", fmt.format_pieces)
    guard.format_whole = timed(
        "black: fixed-point check (tests only)", fmt.format_whole
    )

    if which == "closures":
        source, name = closure_module(), "closure_ops"
    elif which.endswith(".py"):
        source, name = Path(which).read_text(), Path(which).stem
    else:
        source, name = synthetic_module(int(which)), "synthetic_ops"
    lines = len(source.splitlines())
    origin = _origin(Origin, name)
    start = time.process_time()
    text = pipeline.convert(source, origin, Options())
    total = time.process_time() - start
    print(f"{name}: {lines} source lines -> {len(text.splitlines())} generated lines")
    print(f"  import s2sgrad.cli                           {import_s:7.2f} s")
    print(
        f"  convert (in process, after import)          {total:7.2f} s  "
        f"= {lines / total:.0f} lines/s"
    )
    for name, seconds in TOTALS.items():
        print(f"    {name:<42} {seconds:7.2f} s  ({COUNTS[name]} calls)")


def _origin(Origin, name):  # type: ignore[no-untyped-def]
    """An Origin for a top-level module `name` (fields vary between versions)."""
    import dataclasses
    import inspect

    values = {"display_path": f"{name}.py", "module_name": name}
    if dataclasses.is_dataclass(Origin):
        fields = {f.name for f in dataclasses.fields(Origin)}
    else:
        fields = set(inspect.signature(Origin).parameters)
    return Origin(**{k: v for k, v in values.items() if k in fields})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "240")
