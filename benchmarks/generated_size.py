"""How big generated code is next to its source: lines of samples/*_grad.py over lines of
samples/*.py, for the whole of samples/ and per differentiator.

Each top-level statement of a generated module owns its lines and the blank lines after
it; a differentiator `f` owns `f_forward`, `f_backward`, `f_recompute*`,
`FFunction` and `f`, and everything else (header, imports, aliases, helpers) is shared by
the module. On the source side `f` owns its `def` the same way. The median per
differentiator leaves the shared lines out; the ratio over samples/ counts every line.

Run directly for a quick look: `python benchmarks/generated_size.py`.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _spans(text: str) -> dict[str, int]:
    """Lines owned by each named top-level statement (defs, classes, assignments)."""
    tree = ast.parse(text)
    lines = text.splitlines()
    starts = [
        (min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])]), s)
        for s in tree.body
    ]
    owned: dict[str, int] = {}
    for start, statement in starts:
        end = statement.end_lineno or start
        while end < len(lines) and not lines[end].strip():  # and the blank lines after
            end += 1
        name = getattr(statement, "name", None)
        if name is not None:
            owned[name] = owned.get(name, 0) + end - start + 1
    return owned


def _runtime_lines(text: str) -> int:
    """Lines of the runtime every module carries, from its banner to the end."""
    lines = text.splitlines()
    banner = "# The s2sgrad runtime"
    start = next((i for i, line in enumerate(lines) if line.startswith(banner)), None)
    return 0 if start is None else len(lines) - start


def _camel(name: str) -> str:
    stem = name.lstrip("_")
    prefix = "_" * (len(name) - len(stem))
    return prefix + "".join(p[:1].upper() + p[1:] for p in stem.split("_")) + "Function"


def measure(samples: Path = ROOT / "samples") -> dict[str, object]:
    source_lines = generated_lines = runtime_lines = 0
    per: dict[str, float] = {}
    for source in sorted(samples.glob("*.py")):
        output = source.with_name(f"{source.stem}_grad.py")
        if source.stem.endswith("_grad") or not output.exists():
            continue
        src, gen = source.read_text(), output.read_text()
        source_lines += len(src.splitlines())
        generated_lines += len(gen.splitlines())
        runtime_lines += _runtime_lines(gen)
        src_spans, gen_spans = _spans(src), _spans(gen)
        for name in src_spans:
            if f"{name}_forward" not in gen_spans:
                continue  # a helper, not a differentiator
            owned = sum(
                lines
                for generated, lines in gen_spans.items()
                if generated
                in (f"{name}_forward", f"{name}_backward", _camel(name), name)
                or generated.startswith(f"{name}_recompute")
            )
            per[f"{source.stem}.{name}"] = owned / src_spans[name]
    return {
        "source_lines": source_lines,
        "generated_lines": generated_lines,
        "ratio": generated_lines / source_lines,
        "runtime_lines": runtime_lines,
        "ratio_without_runtime": (generated_lines - runtime_lines) / source_lines,
        "median_per_differentiator": statistics.median(per.values()),
        "worst": max(per.items(), key=lambda kv: kv[1]),
        "differentiators": len(per),
    }


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key}: {value}")
