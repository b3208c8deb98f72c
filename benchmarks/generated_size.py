"""How big generated code is next to its source: non-blank lines of samples/*_grad.py over
non-blank lines of samples/*.py, for the whole of samples/ and per differentiator.

Generated modules import `s2sgrad.runtime`; its lines are counted once, on their own
(`runtime_lines`), never in a module's. Each top-level statement of a generated module
owns its non-blank lines; a differentiator `f` owns `f_forward`, `f_backward`,
`f_recompute*`, `FFunction` and `f`, and everything else (header, imports, the format
check) is shared by the module. On the source side `f` owns its `def` the same way. The
median per differentiator leaves the shared lines out; the ratio over samples/ counts
every non-blank line, as the issue's target does. `parts` and `kinds` add up the
differentiators' generated lines by part (forward, backward, Function class, op) and by
kind of line (`def` lines, signatures black wrapped, docstrings, decorators, the rest).

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


def _kinds(text: str, names: set[str]) -> dict[str, int]:
    """Non-blank lines of the top-level statements `names`, by kind: `def` lines,
    black's continuation lines of a signature, docstrings, decorators, the rest."""
    tree = ast.parse(text)
    lines = text.splitlines()
    kinds = dict.fromkeys(("def", "wrapped", "docstring", "decorator", "body"), 0)
    for statement in tree.body:
        if getattr(statement, "name", None) not in names:
            continue
        end = statement.end_lineno or statement.lineno
        owned = {n for n in range(statement.lineno, end + 1) if lines[n - 1].strip()}
        for node in ast.walk(statement):
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            for d in node.decorator_list:
                kinds["decorator"] += 1
                owned.discard(d.lineno)
            first = node.body[0]
            header = range(node.lineno, first.lineno)
            kinds["def"] += 1
            kinds["wrapped"] += sum(1 for n in header if n in owned) - 1
            owned.difference_update(header)
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                doc = range(first.lineno, (first.end_lineno or first.lineno) + 1)
                kinds["docstring"] += sum(1 for n in doc if n in owned)
                owned.difference_update(doc)
        kinds["body"] += len(owned)
    return kinds


def _camel(name: str) -> str:
    stem = name.lstrip("_")
    prefix = "_" * (len(name) - len(stem))
    return prefix + "".join(p[:1].upper() + p[1:] for p in stem.split("_")) + "Function"


def measure(samples: Path = ROOT / "samples") -> dict[str, object]:
    source_lines = generated_lines = 0
    per: dict[str, float] = {}
    parts: dict[str, int] = {}
    kinds = dict.fromkeys(("def", "wrapped", "docstring", "decorator", "body"), 0)
    source_defs = 0
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
            part_of = {
                f"{name}_forward": "forward",
                f"{name}_backward": "backward",
                _camel(name): "Function class",
                name: "op",
            }
            mine = {
                generated: part_of.get(generated, "recompute")
                for generated in gen_spans
                if generated in part_of or generated.startswith(f"{name}_recompute")
            }
            for generated, part in mine.items():
                parts[part] = parts.get(part, 0) + gen_spans[generated]
            for kind, count in _kinds(gen, set(mine)).items():
                kinds[kind] += count
            source_defs += src_spans[name]
            owned = sum(gen_spans[generated] for generated in mine)
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
        # Over all differentiators: the source `def`s' lines, the generated lines of
        # each part, and of each kind of line (see `_kinds`).
        "source_def_lines": source_defs,
        "parts": parts,
        "kinds": kinds,
    }


if __name__ == "__main__":
    for key, value in measure().items():
        if isinstance(value, dict):
            print(f"{key}:")
            for name, figure in value.items():
                print(
                    f"  {name}: {figure:.2f}"
                    if key == "per_differentiator"
                    else f"  {name}: {figure}"
                )
        else:
            print(f"{key}: {value}")
