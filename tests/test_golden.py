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
    imports = [line for line in text.splitlines() if line.startswith(("import", "from"))]
    assert [line for line in imports if "s2sgrad" in line] == [
        next(line for line in imports if line.startswith("from s2sgrad.runtime import "))
    ], "of s2sgrad, generated code imports its runtime only"


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


def _without_docstrings(source: str) -> dict[str, str]:
    """Each top-level function and class of `source`, its docstrings' lines removed."""
    import ast

    tree = ast.parse(source)
    lines = source.splitlines()
    drop = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                drop.update(range(first.lineno, first.end_lineno + 1))
    return {
        node.name: "\n".join(
            line for i, line in enumerate(lines[node.lineno - 1 : node.end_lineno], node.lineno)
            if i not in drop
        )
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }


def test_readme_example_is_the_golden_without_docstrings():
    """The README's generated functions are samples/temporary_grad.py's, docstrings cut;
    its abbreviated Function has the golden's method signatures."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("`s2sgrad convert samples/temporary.py` writes", 1)[1]
    block = block.split("```python\n", 1)[1].split("```", 1)[0]
    shown = _without_docstrings(block)
    golden = _without_docstrings((ROOT / "samples" / "temporary_grad.py").read_text())
    assert set(shown) == {"add_mul_forward", "add_mul_backward", "AddMulFunction", "add_mul"}
    for name in ("add_mul_forward", "add_mul_backward", "add_mul"):
        assert shown[name] == golden[name], f"README's {name} differs from the golden"
    for line in shown["AddMulFunction"].splitlines()[1:]:
        signature = line.split(": ...", 1)[0].strip()
        assert signature in golden["AddMulFunction"], signature


GOLDENS = [p.with_name(f"{p.stem}_grad.py") for p in SOURCES]
#: In this repository ruff takes s2sgrad for a first-party package; in a user's project,
#: where generated code is linted, it is an installed one.
AS_IN_A_USERS_PROJECT = ("--config", "lint.isort.known-third-party = ['s2sgrad']")


def test_goldens_pass_ruff_with_import_sorting(tmp_path):
    """ruff's default rules plus `I`, whatever the project's own configuration says."""
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F,I", *AS_IN_A_USERS_PROJECT, *map(str, GOLDENS)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_standalone_modules_pass_ruff(tmp_path):
    """What `--standalone` copies of the runtime is what the module uses: every
    import it carries is read (F401 flagged a transform helper only `_setitem`
    reads, in every module that does not store by index)."""
    paths = []
    for source in SOURCES:
        path = tmp_path / f"{source.stem}_grad.py"
        path.write_text(
            transform(source.read_text(), source.name, source.stem, standalone=True)
        )
        paths.append(str(path))
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F", *paths],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_goldens_pass_mypy_strict(tmp_path):
    """Generated code is typed; the user's own modules are followed silently."""
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
         *map(str, GOLDENS)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


#: Constructs the samples do not have, whose generated code once failed `mypy --strict`:
#: list parameters and outputs, a flat int output, a kind known only at run time.
TYPED_CONSTRUCTS = '''
from typing import List

import torch


def scaled_sum(xs: List[torch.Tensor], ws: List[torch.Tensor], b: torch.Tensor):
    out = b * 1.0
    for x, w in zip(xs, ws, strict=True):
        out = out + x * w
    def backward(g):
        return [g * w for w in ws], [g * x for x in xs], g
    return out, backward


def rows_and_total(x: torch.Tensor):
    rows = list(x.unbind(0))
    total = x.sum()
    def backward(grows, gtotal):
        return torch.stack(grows, 0) + gtotal
    return rows, total, backward


def sine_and_count(x: torch.Tensor):
    y = x.sin()
    n = x.shape[0]
    def backward(gy, gn):
        return gy * x.cos()
    return y, n, backward


def positive_part(x: torch.Tensor):
    nz = torch.nonzero(x > 0, as_tuple=True)
    y = x[nz]
    def backward(g):
        gx = torch.zeros_like(x)
        gx[nz] = g
        return gx
    return y, backward


def _twice(v):
    return v * 2.0


def helped(x: torch.Tensor):
    # An untyped helper: the module turns mypy's no-untyped-call off, and a
    # standalone one then drops the runtime's own ignores of it (else unused).
    t = torch.tanh(_twice(x))
    def backward(g):
        return g * (1 - t * t) * 2.0
    return t, backward


def accumulated(x: torch.Tensor, w: torch.Tensor, k: int = 2):
    # Names first bound to a number, then to a tensor: `total: Any = 0` in the
    # module, where mypy took `int` from the first binding and refused the second.
    total = 0
    for i in range(k):
        total = total + x * w * i
    n = 0
    n += 1
    def backward(g):
        gw = 0.0
        gw += g * x
        acc = 0
        for i in range(k):
            acc = acc + g * w * i
        return acc, gw * (k - 1) * k / 2, None
    return total * n, backward
'''


def test_generated_code_for_lists_and_run_time_kinds_passes_mypy_strict(tmp_path):
    from s2sgrad import transform

    (tmp_path / "constructs.py").write_text(TYPED_CONSTRUCTS.lstrip())
    generated = tmp_path / "constructs_grad.py"
    generated.write_text(
        transform(TYPED_CONSTRUCTS.lstrip(), "constructs.py", "constructs")
    )
    assert "_save(ctx, " in generated.read_text()  # the run-time kind is there
    standalone = tmp_path / "constructs_standalone.py"
    standalone.write_text(
        transform(
            TYPED_CONSTRUCTS.lstrip(), "constructs.py", "constructs", standalone=True
        )
    )
    assert "def _save(" in standalone.read_text()  # and carried
    assert '# mypy: disable-error-code="no-untyped-call"' in standalone.read_text()
    # bugbear too, which projects often add (B905: `zip` without `strict=`).
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F,B", str(generated), str(standalone)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "total: Any = 0\n" in generated.read_text()
    assert "    n = 0\n" in generated.read_text()  # an int throughout: as written
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(generated),
         str(standalone)],
        cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "MYPYPATH": str(ROOT)},  # an editable install hides s2sgrad
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_imports_only_what_the_generated_code_reads():
    """The closure's own return annotation is not copied, so what only it reads
    (`Callable`, `Tuple` here) is not imported: ruff's F401 would flag it."""
    from s2sgrad import transform

    source = (
        "from typing import Callable, Optional, Tuple\n\nimport torch\n\n\n"
        "def f(x: torch.Tensor, b: Optional[torch.Tensor] = None)"
        " -> Tuple[torch.Tensor, Callable]:\n"
        "    y = x.exp() if b is None else x.exp() + b\n"
        "    def backward(g):\n"
        "        return g * x.exp(), (None if b is None else g)\n"
        "    return y, backward\n"
    )
    text = transform(source, "f.py")
    assert "from typing import Any, Optional, cast\n" in text
    _assert_ruff_clean(text)


def test_an_aliased_import_has_a_line_of_its_own():
    """ruff's isort (no `combine-as-imports`) puts `name as alias` on its own line:
    `from pk.util import helper, helper as double` failed I001."""
    from s2sgrad import transform

    source = (
        "import torch\n\nfrom .util import helper\nfrom .util import helper as double"
        "\nfrom .util import Scale as S\n\n\n"
        "def f(x: torch.Tensor):\n"
        "    y: torch.Tensor = helper(x) * S.k\n"
        "    def backward(grad):\n"
        "        return double(grad) * S.k\n"
        "    return y, backward\n"
    )
    text = transform(source, "pk/ops.py", "pk.ops")
    assert (
        "from pk.util import Scale as S\nfrom pk.util import helper\n"
        "from pk.util import helper as double\n"
    ) in text
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F,I", *AS_IN_A_USERS_PROJECT,
         "--config", "lint.isort.known-first-party = ['pk']", "-"],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def test_imports_what_string_annotations_read():
    """`xs: "List[torch.Tensor]"` is copied into the generated signatures, so `List`
    is imported (ruff's F821 would flag it otherwise)."""
    from s2sgrad import transform

    source = (
        "from typing import List\n\nimport torch\n\n\n"
        'def total(xs: "List[torch.Tensor]"):\n'
        "    out = torch.stack(xs).sum(0)\n"
        "    def backward(g):\n"
        "        return [g for _ in xs]\n"
        "    return out, backward\n"
    )
    text = transform(source, "total.py")
    assert "from typing import Any, List, cast\n" in text
    _assert_ruff_clean(text)


def _assert_ruff_clean(text: str) -> None:
    """ruff's default rules plus `I` pass on a generated module's text."""
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F,I", *AS_IN_A_USERS_PROJECT, "-"],
        input=text, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
