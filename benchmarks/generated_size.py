"""How big generated code is next to its source: non-blank lines of samples/*_grad.py over
non-blank lines of samples/*.py, for the whole of samples/ and per differentiator.

Generated modules import `s2sgrad.runtime`; its lines are counted once, on their own
(`runtime_lines`), never in a module's. Each top-level statement of a generated module
owns its non-blank lines; a differentiator `f` owns `f_forward`, `f_backward`,
`f_recompute*`, `FFunction` and `f`, and everything else (header, imports, the format
check) is shared by the module. On the source side `f` owns its `def` the same way. The
median per differentiator leaves the shared lines out; the ratio over samples/ counts
every non-blank line, as the issue's target does.

Run directly for a quick look: `python benchmarks/generated_size.py`.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _non_blank(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def _spans(text: str) -> dict[str, int]:
    """Non-blank lines owned by each named top-level statement (defs and classes)."""
    tree = ast.parse(text)
    lines = text.splitlines()
    owned: dict[str, int] = {}
    for statement in tree.body:
        name = getattr(statement, "name", None)
        if name is None:
            continue
        start = min(
            [statement.lineno]
            + [d.lineno for d in getattr(statement, "decorator_list", [])]
        )
        end = statement.end_lineno or start
        owned[name] = owned.get(name, 0) + _non_blank("\n".join(lines[start - 1 : end]))
    return owned


def _camel(name: str) -> str:
    stem = name.lstrip("_")
    prefix = "_" * (len(name) - len(stem))
    return prefix + "".join(p[:1].upper() + p[1:] for p in stem.split("_")) + "Function"


def measure(samples: Path = ROOT / "samples") -> dict[str, object]:
    source_lines = generated_lines = 0
    per: dict[str, float] = {}
    for source in sorted(samples.glob("*.py")):
        output = source.with_name(f"{source.stem}_grad.py")
        if source.stem.endswith("_grad"):
            continue
        src = source.read_text()
        source_lines += _non_blank(src)
        if not output.exists():
            continue
        gen = output.read_text()
        generated_lines += _non_blank(gen)
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
    runtime = (ROOT / "s2sgrad" / "runtime.py").read_text()
    return {
        "source_lines": source_lines,
        "generated_lines": generated_lines,
        "ratio": generated_lines / source_lines,
        "runtime_lines": _non_blank(runtime),
        "median_per_differentiator": statistics.median(per.values()),
        "worst": max(per.items(), key=lambda kv: kv[1]),
        "per_differentiator": dict(sorted(per.items())),
        "differentiators": len(per),
    }


if __name__ == "__main__":
    for key, value in measure().items():
        if key == "per_differentiator":
            assert isinstance(value, dict)
            for name, ratio in value.items():
                print(f"  {name}: {ratio:.2f}")
        else:
            print(f"{key}: {value}")
