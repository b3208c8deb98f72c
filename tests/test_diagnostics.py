"""The error contract (DESIGN section 7), checked on every construct s2sgrad rejects.

Each file in tests/bad_inputs/ is a small module with one construct outside the input
language; its first line says what must be reported: `# expect: S2S101 8:9` (the code,
and the line and column of the caret). Every case runs the CLI on a copy of the file
next to a pre-existing `<stem>_grad.py` and checks: exit code 2, the located header,
the source line with a caret under the column, no traceback, exactly one error, the old
output byte-identical and no other file created. A few cases run the real
`python -m s2sgrad` in a subprocess; the rest call `s2sgrad.cli.main` in-process, which
runs the same code without paying for a fresh interpreter each time.

Diagnostics that point at no source line (the file as a whole, or a fact the source
does not show) render without one: S2S003, S2S004 and S2S115, documented in
docs/errors.md. For a non-UTF-8 file (S2S002) the line is shown decoded with U+FFFD
in place of the bad bytes, and the caret is under the first of them.

`test_huge_module` generates a 50,000-line module (about 1.2 MB) into tmp_path rather
than committing it; it guards against work that grows faster than the module (the
frontend once spent minutes on 5,000 lines) and checks positions deep into a file.
Timing (2 cores, serial): about 20 s of CPU for the huge module, mostly libcst's
parser, and about 20 s for everything else.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from s2sgrad.cli import main
from s2sgrad.diagnostics import CODES

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "bad_inputs"
CASES = sorted(BAD.glob("*.py"))
EXPECT = re.compile(r"# expect: (S2S\d{3}) (\d+):(\d+)")
HEADER = re.compile(r"^(\S+):(\d+):(\d+): error\[(S2S\d{3})\]: ", re.MULTILINE)
NEWLINE = re.compile(r"\r\n|\r|\n")
SENTINEL = b"# sentinel: a failed run must leave this file alone\n"
NO_SOURCE_LINE = {"S2S003", "S2S004", "S2S115"}
#: Run through a real interpreter: one per kind of input, the odd encodings included.
SUBPROCESS = {
    "early_return.py",
    "inplace_captured_backward.py",
    "backward_called_in_forward.py",
    "too_many_gradients.py",
    "undefined_name_forward.py",
    "syntax_error_unclosed_paren.py",
    "non_utf8.py",
    "empty.py",
    "crlf_line_endings.py",
    "deeply_nested_expression.py",
}


def _text(data: bytes) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", errors="replace")


def _expected(path: Path) -> tuple[str, int, int]:
    first = NEWLINE.split(_text(path.read_bytes()), maxsplit=1)[0]
    found = EXPECT.fullmatch(first.strip())
    assert found, f"{path.name}: first line must be `# expect: CODE LINE:COL`"
    return found.group(1), int(found.group(2)), int(found.group(3))


def _shown(line: str) -> str:
    """A source line as the diagnostic renders it (tabs and control chars as spaces)."""
    return "".join(
        " " if ord(c) < 32 or ord(c) == 127 else c for c in line.expandtabs(1)
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


def _convert(
    args: list[str],
    cwd: Path,
    real: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str]:
    """Run `s2sgrad convert ARGS` in `cwd`; return the exit code and stderr."""
    if real:
        proc = subprocess.run(
            [sys.executable, "-m", "s2sgrad", "convert", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.stdout == ""
        return proc.returncode, proc.stderr
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(["convert", *args])
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, captured.err


def _check_caret(source_line: str, column: int, shown: list[str], err: str) -> None:
    """The source line is shown, whole or as a `...` window, with `^` under `column`."""
    expected = _shown(source_line)
    text, caret = shown[0].removeprefix("    "), shown[1].removeprefix("    ")
    assert caret.strip() == "^" and caret.endswith("^"), err
    if len(expected) <= 120:
        assert text == expected and caret == " " * (column - 1) + "^", err
        return
    inner = text.removeprefix("...").removesuffix("...")
    start = expected.index(inner)
    assert len(text) <= 120 and start > 0 or text.endswith("..."), err
    assert (
        start + len(caret) - 1 - (len(text) - len(text.removeprefix("...")))
        == column - 1
    ), err


def _check_rejected(
    source: Path,
    tmp_path: Path,
    real: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """Convert a copy of `source` next to a sentinel output; check the whole contract."""
    code, line, column = _expected(source)
    data = source.read_bytes()
    (tmp_path / source.name).write_bytes(data)
    (tmp_path / f"{source.stem}_grad.py").write_bytes(SENTINEL)
    before = _snapshot(tmp_path)

    status, err = _convert([source.name], tmp_path, real, capsys, monkeypatch)

    assert status == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert f"{source.name}:{line}:{column}: error[{code}]: " in err, err
    headers = HEADER.findall(err)
    assert len(headers) == 1, f"expected one error, got:\n{err}"
    after_header = err.split("\n")[1:3]
    # S2S003 about a method shaped like a differentiator points at the method.
    if code in NO_SOURCE_LINE and source.name != "differentiator_as_a_method.py":
        assert not any(part.strip() == "^" for part in after_header), err
    else:
        _check_caret(NEWLINE.split(_text(data))[line - 1], column, after_header, err)
    assert "nothing written" in err
    assert _snapshot(tmp_path) == before, "a failed run must not write anything"
    return err


@pytest.mark.parametrize("source", CASES, ids=[p.name for p in CASES])
def test_rejected(
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _check_rejected(source, tmp_path, source.name in SUBPROCESS, capsys, monkeypatch)


def test_corpus_is_large_and_covers_the_frontend_codes() -> None:
    assert len(CASES) >= 45
    codes = {_expected(p)[0] for p in CASES}
    frontend = {c for c in CODES if c >= "S2S101"} | {"S2S001", "S2S002", "S2S003"}
    assert frontend <= codes, f"no bad input for {sorted(frontend - codes)}"


GOOD = '''\
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
'''


def test_directory_with_one_bad_file_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "ops"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text(GOOD)
    (package / "bad.py").write_bytes((BAD / "early_return.py").read_bytes())
    before = _snapshot(tmp_path)

    status, err = _convert(["ops"], tmp_path, True, capsys, monkeypatch)
    assert status == 2, err
    assert "ops/bad.py:8:9: error[S2S101]: " in err, err
    assert "Traceback" not in err
    assert _snapshot(tmp_path) == before

    status, err = _convert(["ops", "-o", "out"], tmp_path, False, capsys, monkeypatch)
    assert status == 2, err
    assert not (tmp_path / "out").exists()
    assert _snapshot(tmp_path) == before


SEVERAL = """\
import torch


def early(x: torch.Tensor, k: float):
    if k == 0:
        return x, None
    def backward(grad):
        return grad * k, None
    return x * k, backward


def typo(x: torch.Tensor):
    def backward(grad):
        return grad * torhc.cos(x)
    return torch.sin(x), backward


def counted(x: torch.Tensor, y: torch.Tensor):
    def backward(grad):
        return grad * y, grad * x, None
    return x * y, backward


def mutates(x: torch.Tensor):
    t = x * 2
    def backward(grad):
        t.mul_(grad)
        return t
    return t, backward


def fine(x: torch.Tensor):
    def backward(grad):
        return grad
    return x.clone(), backward


def lambda_one(x: torch.Tensor):
    return -x, lambda grad: -grad
"""


def test_every_error_of_a_file_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "several.py").write_text(SEVERAL)
    status, err = _convert(["several.py"], tmp_path, False, capsys, monkeypatch)
    assert status == 2, err
    assert [
        (int(line), int(col), code) for _, line, col, code in HEADER.findall(err)
    ] == [
        (6, 9, "S2S101"),
        (14, 23, "S2S112"),
        (20, 9, "S2S108"),
        (27, 9, "S2S103"),
        (39, 16, "S2S109"),
    ], err
    assert "did you mean `torch`?" in err
    assert list((tmp_path).iterdir()) == [tmp_path / "several.py"]


def make_huge(lines: int = 50_000) -> tuple[str, int, int]:
    """A valid module of `lines` lines, like a large library module: a constant
    table, many plain helpers and classes, and a differentiator every ~1000 lines;
    the last differentiator, near the end, returns one gradient too many.

    Returns the source and the line and column the error must point at.
    """
    out = ["import math", "", "import torch", "", "", "_TABLE = ["]
    out += [f"    {math.sin(i):.6f}," for i in range(5000)]
    out += ["]", "", ""]
    index = 0
    while len(out) < lines - 12:
        if index % 100 == 99:
            out += [
                f"def op_{index}(x: torch.Tensor, y: torch.Tensor):",
                f'    """x * y + {index}."""',
                f"    t = x * y * _TABLE[{index % 5000}]",
                "    def backward(grad):",
                f"        return grad * y * _TABLE[{index % 5000}], grad * x * _TABLE[{index % 5000}]",
                f"    return t + {index}, backward",
            ]
        elif index % 10 == 9:
            out += [
                f"class Layer{index}(torch.nn.Module):",
                "    def forward(self, x):",
                f"        return helper_{index - 1}(x, x)",
            ]
        else:
            out += [
                f"def helper_{index}(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:",
                f'    """A plain helper, {index}."""',
                "    if x.dim() > 1:",
                "        x = x.flatten()",
                f"    return (x * y).sum() + math.cos({index})",
            ]
        out += ["", ""]
        index += 1
    out += [
        f"def op_{index}(x: torch.Tensor, y: torch.Tensor):",
        "    def backward(grad):",
        "        return grad * y, grad * x, None",
        "    return x * y, backward",
    ]
    return "\n".join(out) + "\n", len(out) - 1, 9


def test_huge_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, line, column = make_huge()
    assert source.count("\n") >= 50_000 - 10
    path = tmp_path / "huge.py"
    path.write_text(f"# expect: S2S108 {line + 1}:{column}\n" + source)
    folder = tmp_path / "run"
    folder.mkdir()
    _check_rejected(path, folder, False, capsys, monkeypatch)


def test_unreadable_file_in_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "good.py").write_text(GOOD)
    (tmp_path / "ops" / "odd.py").mkdir()  # a directory named like a module
    status, err = _convert(["ops"], tmp_path, False, capsys, monkeypatch)
    assert status == 2, err
    assert re.search(r"^ops/odd\.py:1:1: error\[S2S004\]: cannot read: ", err, re.M), (
        err
    )
    assert not (tmp_path / "ops" / "good_grad.py").exists()


ACCEPTED = {
    "return_inside_if_in_backward": """
def f(x, flag: bool):
    t = x * 2
    def backward(grad):
        if flag:
            return grad * 2, None
        return None
    return t, backward
""",
    "local_mutation_in_backward": """
def f(x):
    t = x * 2
    def backward(grad):
        g = grad.clone()
        g.mul_(2)
        g[0] = 0
        return g
    return t, backward
""",
    "backward_that_raises": """
def f(x):
    def backward(grad):
        raise RuntimeError("not differentiable")
    return x.round(), backward
""",
    "loop_and_augmented_assignment_in_forward": """
def f(x, n: int):
    t = x
    for _ in range(n):
        t = t * x
    s = x.sum()
    s += 1
    def backward(grad):
        return grad * (n + 1) * t / x, None
    return t * s, backward
""",
    "late_binding": """
def f(x):
    def backward(grad):
        return grad * scale
    scale = x.detach() * 2
    return x * scale, backward
""",
    "keyword_only_and_positional_only": """
def f(x, /, y, *, z):
    def backward(grad, /):
        return grad * y * z, grad * x * z, grad * x * y
    return x * y * z, backward
""",
    "nested_helper_and_with": """
def f(x):
    def helper(v):
        return v * 2
    with torch.no_grad():
        k = x.abs().max()
    def backward(grad):
        return helper(grad) / k
    return helper(x) / k, backward
""",
    "list_built_in_forward": """
def f(x, y):
    parts = []
    parts.append(x)
    parts.append(y)
    def backward(grad):
        return tuple(grad[i] for i in range(len(parts)))
    return torch.stack(parts), backward
""",
    "plain_functions_beside": """
def f(x):
    def backward(grad):
        return grad * 2
    return x * 2, backward


def make_key(x):
    key = lambda v: -v
    return x, key


def first_of(x, y):
    def pick(pair):
        return pair[0]
    return pick((x, y))
""",
    "sibling_result_and_its_closure_called_in_backward": """
def g(x):
    def backward(grad):
        return grad * 2
    return x * 2, backward


def f(x):
    u, unused = g(x)
    v = g(x)[0]
    def backward(grad):
        return g(x)[1](grad * v) + g(x)[-1](grad * u)
    return u * v, backward
""",
    "utf8_bom_and_crlf": "\ufeffdef f(x):\r\n    def backward(grad):\r\n        return grad\r\n    return x.clone(), backward\r\n",
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted(
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Constructs inside the language stay accepted (no over-eager checks)."""
    body = ACCEPTED[name]
    text = body if body.startswith("\ufeff") else "import torch\n" + body
    (tmp_path / "ok.py").write_bytes(text.encode("utf-8"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    status = main(["convert", "ok.py", "--stdout"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "def f_forward" in captured.out


def _documented() -> str:
    return (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")


def test_every_code_is_documented() -> None:
    headings = set(re.findall(r"^## (S2S\d{3})\b", _documented(), re.MULTILINE))
    assert set(CODES) <= headings, f"undocumented: {sorted(set(CODES) - headings)}"
    assert headings <= set(CODES), (
        f"documented but unknown: {sorted(headings - set(CODES))}"
    )


def test_every_code_used_is_known() -> None:
    used: dict[str, str] = {}
    for path in sorted((ROOT / "s2sgrad").rglob("*.py")):
        for code in re.findall(r"S2S\d{3}", path.read_text(encoding="utf-8")):
            used.setdefault(code, str(path.relative_to(ROOT)))
    unknown = {code: where for code, where in used.items() if code not in CODES}
    assert not unknown, f"codes used but not in CODES: {unknown}"


SECTION = re.compile(r"^## (S2S\d{3})\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
EXAMPLE = re.compile(r"```python\n(.*?)```.*?```text\n(.*?)```", re.DOTALL)


def test_documented_outputs_are_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example in docs/errors.md, saved as example.py, gives the output shown."""
    sections = SECTION.findall(_documented())
    assert [code for code, _ in sections] == list(CODES)
    checked = 0
    for code, text in sections:
        found = EXAMPLE.search(text)
        if found is None:  # S2S002, S2S004 and S2S118 show output only
            continue
        folder = tmp_path / code
        folder.mkdir()
        (folder / "example.py").write_text(found.group(1), encoding="utf-8")
        status, err = _convert(["example.py"], folder, False, capsys, monkeypatch)
        assert status == 2, (code, err)
        assert err == found.group(2), (code, err)
        assert f": error[{code}]: " in err
        checked += 1
    assert checked == len(CODES) - 3
