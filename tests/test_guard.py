"""The generated-code guard: a codegen bug is an internal error, never a written file."""

import subprocess
import sys

import pytest

from s2sgrad.codegen.guard import GeneratedCodeError, check_generated

GOOD = "import torch\n\n\ndef f(x):\n    return torch.exp(x)\n"


def test_sound_module_passes():
    check_generated(GOOD, 88)


@pytest.mark.parametrize(
    "text, why",
    [
        ("def f(:\n", "does not compile"),
        ("import torch\ndef f(x):  return x\n", "not stable under black"),
        ("def f(x):\n    return torch.exp(x)\n", "undefined names: torch"),
        ("def f():\n    return [y for y in range(3)] + zz\n", "undefined names: zz"),
    ],
)
def test_broken_module_is_caught(text, why):
    with pytest.raises(GeneratedCodeError, match=why):
        check_generated(text, 88, fixed_point=True)


def test_production_skips_the_second_formatting_pass():
    check_generated("import torch\ndef f(x):  return x\n", 88)


def test_guard_failure_exits_123_and_writes_nothing(tmp_path):
    (tmp_path / "ops.py").write_text(
        "import torch\n\n\ndef sq(x):\n    def backward(grad):\n        return 2.0 * grad * x\n"
        "    return x * x, backward\n"
    )
    (tmp_path / "ops_grad.py").write_text("sentinel\n")
    script = (
        "import sys\n"
        "import s2sgrad.codegen as codegen\n"
        "codegen.format_pieces = lambda pieces, n: (*pieces, 'undefined_name_from_a_bug\\n')\n"
        "from s2sgrad.cli import main\n"
        "sys.exit(main(['convert', 'ops.py']))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 123, run.stderr
    assert "bug in s2sgrad" in run.stderr and "GeneratedCodeError" in run.stderr
    assert (tmp_path / "ops_grad.py").read_text() == "sentinel\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.py", "ops_grad.py"]


_UNFORMATTED = """
import torch
x=1
# the helper's comment
def helper(a,b):
    return a+b
y = helper(1,2)
class Box:
    value: int=1
    def get(self): return self.value
@staticmethod
def decorated():
    pass
# a trailing comment
"""


def test_formatting_piece_by_piece_is_what_black_makes_of_the_whole() -> None:
    """format_code cuts the module before each top-level definition (comments and
    decorators above it kept with it) and formats the pieces on their own: the joined
    text must be black's for the whole module, byte for byte."""
    from s2sgrad.codegen.fmt import format_code, format_whole, pieces

    assert len(pieces(_UNFORMATTED)) == 4
    assert pieces(_UNFORMATTED)[1].startswith("# the helper's comment\ndef helper")
    assert format_code(_UNFORMATTED, 88) == format_whole(_UNFORMATTED, 88)
    assert format_code(_UNFORMATTED, 88) != _UNFORMATTED


def test_a_form_feed_in_a_string_does_not_move_where_black_cuts():
    """`str.splitlines` breaks a line at a form feed inside a string, `ast` does not:
    the module was cut for black lines away from its definitions (an internal error,
    "'return' outside function")."""
    import torch

    from s2sgrad import transform

    source = (
        "import torch\n\n\n"
        "def f(x: torch.Tensor):\n"
        '    s = "a\x0cb\x0bc\x0cd"\n'
        "    y = x * len(s)\n"
        "    def backward(g):\n"
        "        return g * len(s)\n"
        "    return y, backward\n\n\n"
        "def h(x: torch.Tensor):\n"
        "    def backward(g):\n"
        "        return 3 * g\n"
        "    return 3 * x, backward\n"
    )
    text = transform(source, "m.py")
    assert '"a\x0cb\x0bc\x0cd"' in text
    namespace: dict[str, object] = {}
    exec(compile(text, "m_grad.py", "exec"), namespace)  # noqa: S102
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(namespace["f"](x).sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 7.0))
