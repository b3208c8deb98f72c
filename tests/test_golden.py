"""Golden files: every sample regenerates byte for byte, and the output is well formed.

Refresh after a deliberate change with `s2sgrad convert samples/` from the repository root.
"""

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from s2sgrad import transform
from s2sgrad.codegen.fmt import format_code

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p for p in (ROOT / "samples").glob("*.py") if p.stem != "__init__" and not p.stem.endswith("_grad")
)
REFRESH = "s2sgrad convert samples/   # from the repository root"


def regenerate(source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix()
    return transform(source.read_text(), rel, f"samples.{source.stem}")


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_sample_regenerates_byte_for_byte(source):
    golden = source.with_name(f"{source.stem}_grad.py")
    assert golden.exists(), f"missing golden {golden.name}; run: {REFRESH}"
    expected = golden.read_text()
    got = regenerate(source)
    if got != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(True), got.splitlines(True), str(golden), "regenerated"))
        pytest.fail(f"{golden.name} is stale:\n{diff}\nrefresh with: {REFRESH}")


@pytest.mark.parametrize("source", SOURCES, ids=[p.stem for p in SOURCES])
def test_generated_code_compiles_and_is_black_stable(source):
    text = regenerate(source)
    compile(text, source.name, "exec")
    assert format_code(text, 88) == text
    assert "s2sgrad" not in "".join(line for line in text.splitlines() if line.startswith(("import", "from")))


def test_output_is_identical_under_two_hash_seeds():
    outputs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-m", "s2sgrad", "convert", "samples", "--stdout"],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True,
        )
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]
    goldens = "".join(p.with_name(f"{p.stem}_grad.py").read_text() for p in SOURCES)
    assert outputs[0] == goldens
