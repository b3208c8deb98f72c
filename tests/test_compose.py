"""Composition through captured backwards (issue 24, point 5).

Forward may call another differentiator and keep its closure, `y, back_y = inner(x)`,
for backward to call, `back_y(g)`, as `jax.vjp` composes. It was S2S120. Now
`s2sgrad/frontend/compose.py` writes the kept closure as the calls the rest of s2sgrad
translates: `y, _ = inner(x)` in forward and `inner(x')[1](g)` in backward, with `x'`
the argument's value at the call (bound to a fresh name first where forward rebinds
it later, or where it is an expression). Each case is checked against torch.autograd
through the closure's own forward, where `back_y` really is inner's closure, at orders
1 to 3, pure and mixed (tests/oracle.py), in float64, with a parameter broadcast
against the batch whose gradient inner returns unreduced; and with gradcheck and
gradgradcheck. What cannot be honoured is a located error: one test per kind.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import (
    assert_same,
    closure_and_op,
    derivatives,
    function,
    leaves,
    mypy_strict,
)

from s2sgrad import transform
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.compose import compose
from s2sgrad.header import Origin, source_hash
from s2sgrad.options import Options
from s2sgrad.pipeline import differentiator_names
from s2sgrad.review.model import review

F64 = torch.float64
ROOT = Path(__file__).resolve().parent.parent

SOURCE = """
import torch


def inner(x, w):
    t = torch.tanh(x * w)
    def backward(g):
        d = 2 * g * t * (1 - t * t)
        return d * w, d * x
    return t * t, backward


def sin_cos(x, w):
    s = torch.sin(x * w)
    c = torch.cos(x * w)
    def backward(gs, gc):
        d = gs * c - gc * s
        return d * w, d * x
    return (s, c), backward


def scaled(x, scale: float = 2.0):
    e = torch.exp(x)
    def backward(g):
        return g * e * scale, None
    return e * scale, backward


def lin(x, w):
    def backward(g):
        return g * w, g * x
    return x * w, backward


def swish(x):
    s = torch.sigmoid(x)
    def backward(g):
        return g * (s + x * s * (1 - s))
    return x * s, backward


def single(x, w):
    y, back_y = inner(x, w)
    z = y.exp()
    def backward(g):
        gy = g * x * z
        gx, gw = back_y(gy)
        return gx + g * z, gw
    return z * x, backward


def two_calls(x, w):
    h, back_h = inner(x, w)
    y, back_y = inner(h, w)
    def backward(g):
        gh, gw2 = back_y(g)
        gx, gw1 = back_h(gh)
        return gx, gw1 + gw2
    return y, backward


def in_a_loop(x, w, n: int = 3):
    s = w
    for _ in range(n):
        y, back = inner(x, s)
        s = s * 0.5
    def backward(g):
        gx, gs = back(g)
        return gx, gs * 0.5 ** (n - 1), None
    return y, backward


def called_twice(x, w):
    y, back = inner(x * 2.0, w)
    def backward(g):
        a, b = back(g)
        c, d = back(g * y)
        return 2.0 * (a + c), b + d
    return y * y / 2 + y, backward


def two_outputs(x, w):
    (s, c), back = sin_cos(x, w)
    def backward(g):
        return back(g * c, g * s)
    return s * c, backward


def none_for_a_parameter(x, w):
    e, back = scaled(x * w, 3.0)
    def backward(g):
        gxw, gscale = back(g)
        assert gscale is None
        return gxw * w, gxw * x
    return e, backward


def rebinds_its_argument(x, w):
    h = x * 1.5
    y, back = inner(h, w)
    h = h * y
    def backward(g):
        gh_mul = g * y
        gh_in, gw = back(g * h / y)
        return 1.5 * (gh_mul + gh_in), gw
    return h, backward


def nested(x, w):
    y, back = two_calls(x, w)
    def backward(g):
        gx, gw = back(3.0 * g)
        return gx, gw
    return 3.0 * y, backward


def in_a_branch(x, w, on: bool = True):
    y = x * w
    if on:
        y, back = inner(x, w)
    def backward(g):
        if on:
            gx, gw = back(g)
            return gx, gw, None
        return g * w, g * x, None
    return y * 1.0, backward


def reads_underscore(x, w):
    _ = 2.0
    y, back = inner(x, w)
    def backward(g):
        gx, gw = back(g * _)
        return gx, gw
    return y * _, backward


def chained(x, w):
    # One closure's gradient handed straight to another's: `lin_backward` takes a
    # tensor and `swish_backward` returns `Grad`, which mypy --strict refused.
    h, lin_back = lin(x, w)
    a, act_back = swish(h)
    def backward(g):
        return lin_back(act_back(g))
    return a, backward
"""

#: name -> the other arguments after (x, w).
CASES: dict[str, tuple[Any, ...]] = {
    "single": (),
    "two_calls": (),
    "in_a_loop": (),
    "called_twice": (),
    "two_outputs": (),
    "none_for_a_parameter": (),
    "rebinds_its_argument": (),
    "nested": (),
    "in_a_branch": (True,),
    "in_a_branch_off": (False,),
    "reads_underscore": (),
    "chained": (),
}


@pytest.fixture(scope="module")
def text() -> str:
    return transform(SOURCE, "composed.py")


@pytest.fixture(scope="module")
def modules(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return closure_and_op(SOURCE, text, "composed")


def inputs(seed: int = 0) -> list[torch.Tensor]:
    """x of shape (2, 3) and w of shape (3,): w broadcasts against the batch."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=F64, generator=gen) for shape in ((2, 3), (3,))]


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_equals_autograd_through_the_closure_at_orders_1_to_3(modules, case):
    closures, generated = modules
    name = case.removesuffix("_off")
    rest = CASES[case]
    values = inputs()
    expected = derivatives(lambda *t: closures[name](*t, *rest)[0], leaves(values))
    got = derivatives(lambda *t: generated[name](*t, *rest), leaves(values))
    assert_same(got, expected, what=f"{case}: ")


@pytest.mark.parametrize("name", ["single", "in_a_loop", "called_twice", "nested"])
def test_gradcheck_and_gradgradcheck(modules, name):
    _, generated = modules
    values = leaves(inputs(1))
    assert torch.autograd.gradcheck(generated[name], values)
    assert torch.autograd.gradgradcheck(generated[name], values)


def test_forward_keeps_the_result_and_backward_calls_the_differentiator(text):
    """`y, back_y = inner(x, w)` is forward's `y, _ = inner_forward(x, w)`, and
    `back_y(gy)` is `inner`'s backward over a context recomputed from x and w."""
    forward = function(text, "single_forward")
    assert "y, _ = inner_forward(x, w)" in forward
    backward = function(text, "single_backward")
    assert "gx, gw = inner_backward(inner_forward(x, w)[1], gy)" in backward
    code = [line.split("#")[0] for line in (forward + backward).splitlines()]
    assert not any("back_y" in line for line in code)  # comments quote the source
    backward = function(text, "two_calls_backward")
    assert "inner_backward(inner_forward(h, w)[1], g)" in backward
    assert "inner_backward(inner_forward(x, w)[1], gh)" in backward


def test_an_argument_forward_rebinds_is_kept_as_it_was_at_the_call(text):
    """In the loop, `s` is bound again after the call: backward reads the value the
    last iteration passed (`back_s`), not the one `s` holds at the end."""
    forward = function(text, "in_a_loop_forward")
    assert "\n        back_s = s\n        y, _ = inner_forward(x, back_s)\n" in forward
    backward = function(text, "in_a_loop_backward")
    assert "inner_backward(inner_forward(x, back_s)[1], g)" in backward
    forward = function(text, "rebinds_its_argument_forward")
    assert "\n    back_h = h\n    y, _ = inner_forward(back_h, w)\n" in forward
    backward = function(text, "rebinds_its_argument_backward")
    assert "inner_backward(inner_forward(back_h, w)[1], g * h / y)" in backward


def test_an_argument_that_is_an_expression_is_computed_once(text):
    forward = function(text, "called_twice_forward")
    assert "back_x = x * 2.0\n    y, _ = inner_forward(back_x, w)" in forward
    backward = function(text, "called_twice_backward")
    assert backward.count("inner_backward(inner_forward(back_x, w)[1], g") == 2


def test_where_forward_reads_underscore_the_result_is_taken_by_index(text):
    assert "y = inner_forward(x, w)[0]" in function(text, "reads_underscore_forward")


def test_the_generated_module_passes_ruff(text):
    """`y, _ = ...` rather than `y = ...[0]`: a loop that a recomputation replays
    whole binds `y` for nothing, which ruff's F841 flags in a plain assignment."""
    assert "y, _ = inner_forward(x, back_s)" in function(text, "in_a_loop_recompute")
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache",
         "--select", "E4,E7,E9,F,I", "--config",
         "lint.isort.known-third-party = ['s2sgrad']", "-"],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_generated_module_passes_mypy_strict(text, tmp_path):
    assert mypy_strict(tmp_path, "composed_grad.py", text) == ""


def test_comments_and_the_header_quote_the_source_as_written(text):
    """The rewrite happens before parsing, but what the module says about the source
    is about the source: its hash, and the lines its comments quote."""
    assert f"# s2sgrad-source-sha256: {source_hash(SOURCE)}" in text
    lines = SOURCE.splitlines()
    notes = re.findall(r"# line (\d+):[ ]?(.*)", text)
    assert notes and all(lines[int(n) - 1].strip() == quoted for n, quoted in notes)
    assert "y, back = inner(x * 2.0, w)" in {quoted for _, quoted in notes}


def test_review_shows_the_source_as_written():
    records = review(SOURCE, Origin("composed.py", None), Options(), "composed_grad.py")
    record = next(r for r in records if r.name == "called_twice")
    assert "y, back = inner(x * 2.0, w)" in record.source.text
    captures = {c.name: c for c in record.captures}
    assert captures["back_x"].kind == "temporary" and captures["back_x"].promoted


def test_the_checker_lists_a_composing_module_s_differentiators():
    """`s2sgrad check` asks for the names first: the kept closures are no error."""
    assert differentiator_names(SOURCE, "composed.py") == [
        "inner", "sin_cos", "scaled", "lin", "swish",
        *(n for n in CASES if not n.endswith("_off")),
    ]  # fmt: skip


def test_nothing_is_rewritten_without_a_kept_closure():
    source = "import torch\n\n\ndef f(x):\n    a, b = g(x)\n    return a\n"
    assert compose(source, "plain.py").source is source


# -- a differentiator of another module -------------------------------------------

INNER_MODULE = """
import torch


def inner(x, w):
    t = torch.tanh(x * w)
    def backward(g):
        d = 2 * g * t * (1 - t * t)
        return d * w, d * x
    return t * t, backward
"""

OUTER_MODULE = """
import torch
from composed_inner import inner


def outer(x, w):
    y, back = inner(x, w)
    z = y.exp()
    def backward(g):
        gy = g * x * z
        gx, gw = back(gy)
        return gx + g * z, gw
    return z * x, backward
"""


def test_a_closure_of_an_imported_differentiator_is_right_at_orders_1_to_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An imported `inner` is left as written: backward recomputes what it captures
    from forward (the closure included), under autograd, so every order is right."""
    (tmp_path / "composed_inner.py").write_text(INNER_MODULE)
    (tmp_path / "composed_outer.py").write_text(OUTER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "composed_inner", raising=False)
    text = transform(OUTER_MODULE, "composed_outer.py", "composed_outer")
    closures: dict[str, Any] = {"__name__": "composed_outer"}
    exec(compile(OUTER_MODULE, "composed_outer.py", "exec"), closures)
    generated: dict[str, Any] = {"__name__": "composed_outer_grad"}
    exec(compile(text, "composed_outer_grad.py", "exec"), generated)
    values = inputs()
    expected = derivatives(lambda *t: closures["outer"](*t)[0], leaves(values))
    assert_same(derivatives(generated["outer"], leaves(values)), expected)


# -- what cannot be honoured -------------------------------------------------------

PREAMBLE = """import torch


def inner(x, w):
    t = torch.tanh(x * w)
    def backward(g):
        d = 2 * g * t * (1 - t * t)
        return d * w, d * x
    return t * t, backward


def drop(x):
    mask = (torch.rand_like(x) > 0.5).to(x.dtype)
    def backward(g):
        return g * mask * 2.0
    return x * mask * 2.0, backward


"""
FIRST = PREAMBLE.count("\n") + 1  # the line of the case's `def`

#: name -> (the differentiator, the code, its line within it and the column).
ERRORS: dict[str, tuple[str, str, int, int]] = {
    "returned_by_backward": (
        """def f(x, w):
    y, back = inner(x, w)
    def backward(g):
        return back
    return y, backward
""",
        "S2S120",
        4,
        16,
    ),
    "returned_by_forward": (
        """def f(x, w):
    y, back = inner(x, w)
    def backward(g, gb):
        return back(g)
    return (y, back), backward
""",
        "S2S120",
        5,
        16,
    ),
    "passed_to_a_function": (
        """def f(x, w):
    y, back = inner(x, w)
    def backward(g):
        return torch.func.vmap(back)(g)
    return y, backward
""",
        "S2S120",
        4,
        32,
    ),
    "stored_in_a_list": (
        """def f(x, w):
    y, back = inner(x, w)
    backs = [back]
    def backward(g):
        return backs[0](g)
    return y, backward
""",
        "S2S120",
        3,
        14,
    ),
    "stored_in_a_dict": (
        """def f(x, w):
    y, back = inner(x, w)
    table = {"inner": back}
    def backward(g):
        return table["inner"](g)
    return y, backward
""",
        "S2S120",
        3,
        23,
    ),
    "stored_on_an_attribute": (
        """def f(x, w, state):
    y, back = inner(x, w)
    state.back = back
    def backward(g):
        gx, gw = back(g)
        return gx, gw, None
    return y, backward
""",
        "S2S120",
        3,
        18,
    ),
    "appended_in_a_loop": (
        """def f(x, w, n: int = 2):
    backs = []
    h = x
    for _ in range(n):
        h, back = inner(h, w)
        backs.append(back)
    def backward(g):
        for b in reversed(backs):
            g, _ = b(g)
        return g, None, None
    return h, backward
""",
        "S2S120",
        6,
        22,
    ),
    "called_in_forward": (
        """def f(x, w):
    y, back = inner(x, w)
    slope, _ = back(torch.ones_like(y))
    def backward(g):
        return g * slope, None
    return y, backward
""",
        "S2S120",
        3,
        16,
    ),
    "used_in_another_nested_function": (
        """def f(x, w):
    y, back = inner(x, w)
    def later(g):
        return back(g)
    def backward(g):
        return later(g)
    return y, backward
""",
        "S2S120",
        4,
        16,
    ),
    "bound_in_two_branches": (
        """def f(x, w, flip: bool):
    if flip:
        y, back = inner(w, x)
    else:
        y, back = inner(x, w)
    def backward(g):
        a, b = back(g)
        return a, b, None
    return y, backward
""",
        "S2S120",
        5,
        12,
    ),
    "bound_again_otherwise": (
        """def f(x, w):
    y, back = inner(x, w)
    if x.sum() > 0:
        back = None
    def backward(g):
        return back(g)
    return y, backward
""",
        "S2S120",
        4,
        9,
    ),
    "called_with_too_many_gradients": (
        """def f(x, w):
    y, back = inner(x, w)
    def backward(g):
        return back(g, g)
    return y, backward
""",
        "S2S107",
        4,
        16,
    ),
    "called_with_no_gradient": (
        """def f(x, w):
    y, back = inner(x, w)
    def backward(g):
        return back()
    return y, backward
""",
        "S2S107",
        4,
        16,
    ),
    "random_numbers_in_the_differentiator": (
        """def f(x):
    y, back = drop(x)
    def backward(g):
        return back(g)
    return y, backward
""",
        "S2S121",
        2,
        8,
    ),
}


#: What each message says the closure does.
SAYS = {
    "returned_by_backward": "is returned by backward",
    "returned_by_forward": "is returned by forward",
    "passed_to_a_function": "is passed to `torch.func.vmap` in backward",
    "stored_in_a_list": "is stored in a list in forward",
    "stored_in_a_dict": "is stored in a dict in forward",
    "stored_on_an_attribute": "is stored in `state.back` in forward",
    "appended_in_a_loop": "is passed to `backs.append` in forward",
    "called_in_forward": "is called in forward",
    "used_in_another_nested_function": "is used inside `later`",
    "bound_in_two_branches": "is bound by more than one call, inside a block",
    "bound_again_otherwise": "is bound again",
    "called_with_too_many_gradients": "takes 1 gradient (`g`), but is called with 2",
    "called_with_no_gradient": "takes 1 gradient (`g`), but is called with 0",
    "random_numbers_in_the_differentiator": "draws random numbers (`rand_like`)",
}


def _diagnostics(source: str) -> tuple[Diagnostic, ...]:
    with pytest.raises(TransformError) as caught:
        transform(source, "bad.py")
    return caught.value.diagnostics


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_a_use_that_cannot_be_honoured_is_a_located_error(case):
    body, code, line, column = ERRORS[case]
    source = PREAMBLE + body
    (found,) = [d for d in _diagnostics(source) if d.code == code]
    assert (found.code, found.line, found.column) == (code, FIRST + line - 1, column)
    assert found.source_line == source.splitlines()[found.line - 1]
    assert found.message.startswith("`back`, the closure of")
    assert SAYS[case] in found.message
    assert found.hint


def test_a_closure_forward_keeps_unused_stays_accepted():
    """`y, back = inner(x)` with `back` never read was accepted before: it still is,
    in a branch or bound twice."""
    source = PREAMBLE + (
        "def f(x, w, flip: bool):\n"
        "    if flip:\n"
        "        y, back = inner(w, x)\n"
        "    else:\n"
        "        y, back = inner(x, w)\n"
        "    def backward(g):\n"
        "        return g, g, None\n"
        "    return y, backward\n"
    )
    assert "def f_forward" in transform(source, "unused.py")


def test_a_diagnostic_on_a_rewritten_line_points_into_the_source():
    """`back_h = h.mul_(2); y, _ = inner(back_h, w)` is what the frontend reads; the
    in-place write on an input is reported where the source has it."""
    source = PREAMBLE + (
        "def f(h, w):\n"
        "    y, back = inner(h.mul_(2), w)\n"
        "    def backward(g):\n"
        "        return back(g)\n"
        "    return y, backward\n"
    )
    (found,) = _diagnostics(source)
    text = source.splitlines()[found.line - 1]
    assert found.line == FIRST + 1
    assert found.source_line == text
    assert text[found.column - 1 :].startswith("h.mul_")


DRAWING_SIBLING = """
import torch


def drop(x: torch.Tensor, p: float):
    mask = (torch.rand_like(x) > p).to(x.dtype) / (1 - p)
    def backward(g):
        return g * mask, None
    return x * mask, backward


def outer(x: torch.Tensor):
    y = drop(x, 0.5)[0]
    z = y * y
    def backward(g):
        return 2 * g * y
    return z, backward
"""


def test_a_promoted_result_of_a_sibling_that_draws_is_refused():
    """`y = drop(x, p)[0]`, captured: its gradient came from `drop_backward` over
    `drop_forward` run again in backward, which drew a new mask, and the second
    order was silently wrong. Neither the VJP nor a replay can redraw: S2S121."""
    with pytest.raises(TransformError) as error:
        transform(DRAWING_SIBLING, "drops.py", "drops")
    (diagnostic,) = error.value.diagnostics
    assert (diagnostic.code, diagnostic.line, diagnostic.column) == ("S2S121", 13, 9)
    assert "`drop` draws random numbers (`rand_like`)" in diagnostic.message


CHOSEN_ARGUMENT = """
import torch


def inner(x, w):
    t = torch.tanh(x * w)
    def backward(g):
        d = g * (1 - t * t)
        return d * w, d * x
    return t, backward


def outer(x, w, flag: bool):
    y, back = inner(-x if flag else x, w)
    z = y * y
    def backward(g):
        gx, gw = back(2 * g * y)
        return (-gx if flag else gx), gw, None
    return z, backward


def in_branches(x, w, flag: bool):
    if flag:
        y, back = inner(-x, w)
    else:
        y, back = inner(x, w)
    def backward(g):
        gx, gw = back(g)
        return (-gx if flag else gx), gw, None
    return y, backward
"""


def test_a_closure_kept_from_one_of_two_branches_points_to_choosing_the_argument():
    """Two calls in the branches of an `if` binding one name are S2S120 (which one
    backward reads depends on how forward ran); the hint gives the form that works,
    one call whose argument is chosen, and that form is right at orders 1 to 3."""
    source = CHOSEN_ARGUMENT.replace("def outer", "def _unused_outer")
    with pytest.raises(TransformError) as error:
        transform(source, "chosen.py", "chosen")
    (diagnostic,) = error.value.diagnostics
    assert (diagnostic.code, diagnostic.line) == ("S2S120", 26)
    assert "call `inner` once and choose its arguments" in (diagnostic.hint or "")
    right = CHOSEN_ARGUMENT[: CHOSEN_ARGUMENT.index("\n\ndef in_branches")] + "\n"
    closures, generated = closure_and_op(right, transform(right, "chosen.py"), "chosen")
    for flag in (True, False):
        values = [torch.randn(2, 3, dtype=F64), torch.randn(3, dtype=F64)]
        expected = derivatives(
            lambda *t, flag=flag: closures["outer"](*t, flag)[0], leaves(values)
        )
        got = derivatives(
            lambda *t, flag=flag: generated["outer"](*t, flag), leaves(values)
        )
        assert_same(got, expected)
