"""`check_gradients` and `s2sgrad check` on closures whose backward takes fewer
gradients than forward has outputs, as TorchScript's write `topk`:
`return values, indices, backward` with `def backward(grad_output)`.

The gradients go to the floating-point outputs in order (tests/test_untracked_outputs.py
for the op); the checker weights only those, hands their gradients to the closure's
backward, compares the op with torch.autograd through the closure's forward at every
order (alone and mixed with the output) and its integer outputs for equal values, and
reports a count that does not fit the example inputs instead of crashing.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_checker import SquaredDistanceUnreduced
from test_untracked_outputs import CASES, POOL, SOURCE, inputs

from s2sgrad import testing
from s2sgrad.testing import check_gradients

F64 = torch.float64
MODULE = "checker_untaken_closures"

#: Beside symbolic_script.cpp's closures (SOURCE): a tuple display, wrong backwards, an
#: integer output beside a rule an op gets wrong only mixed, and a surrogate.
EXTRA = '''

def topk_display(self, k: int):
    """`return (values, indices), backward`: the same form as a tuple display."""
    values, indices = torch.topk(self, k)
    def backward(grad_values):
        return torch.zeros_like(self).scatter(-1, indices, grad_values), None
    return (values, indices), backward


def topk_ignores_largest(self, k: int, dim: int = -1, largest: bool = True):
    """Its backward finds the indices again, and forgets `largest`."""
    result0, result1 = torch.topk(self, k, dim, largest)
    def backward(grad_output):
        _, again = torch.topk(self, k, dim)
        return torch.zeros_like(self).scatter(dim, again, grad_output), None, None, None
    return result0, result1, backward


def sorted_tanh_detached(x, w):
    """Right at first order; backward detaches `h`, so its own derivative is not."""
    h = torch.tanh(x * w)
    values, idx = torch.sort(h, dim=-1)
    def backward(grad_values):
        hd = h.detach()
        gh = torch.zeros_like(grad_values).scatter(-1, idx, grad_values) * (1 - hd * hd)
        return gh * w, gh * x
    return idx, values, backward


def squared_distance_argmin(x, y):
    """||x - y||^2 with y broadcast, and the row nearest to y."""
    d = x - y
    def backward(grad):
        g = 2.0 * grad * d
        return g, -g
    return (d * d).sum(), (d * d).sum(-1).argmin(), backward


def sort_ste(x):
    # s2sgrad: surrogate=true
    values, idx = torch.sort(torch.round(x), dim=-1)
    def backward(grad_values):
        return torch.zeros_like(x).scatter(-1, idx, grad_values)
    return idx, values, backward
'''


@pytest.fixture(scope="module")
def closures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """SOURCE and EXTRA as a module on disk, as a user's would be."""
    path = tmp_path_factory.mktemp("untaken")
    (path / f"{MODULE}.py").write_text(SOURCE + EXTRA)
    sys.path.insert(0, str(path))
    yield importlib.import_module(MODULE)
    sys.path.remove(str(path))
    sys.modules.pop(MODULE, None)


def report_of(fn: Any, *args: Any, order: int = 2) -> str:
    with pytest.raises(AssertionError) as caught:
        check_gradients(fn, *args, order=order)
    return str(caught.value)


def x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64)


@pytest.mark.parametrize("case", sorted(CASES))
def test_quiet_at_orders_1_to_3_on_the_closures_with_integer_outputs(closures, case):
    name, shapes, rest = CASES[case]
    said = check_gradients(getattr(closures, name), *inputs(shapes), *rest, order=3)
    assert "right at orders 1 to 3 (each alone and mixed with the output)" in said
    taken = "1" if name == "sorted_tanh" else "0"
    assert f"backward takes the gradient of output {taken} only" in said, said


def test_the_three_torchscript_closures_by_name(closures):
    """topk, kthvalue and max_pool2d_with_indices, which crashed the checker."""
    check_gradients(closures.topk, x(3, 5), 2, order=2)
    check_gradients(closures.kthvalue, x(3, 5), 2, 1, False, order=2)
    check_gradients(closures.max_pool2d_with_indices, x(2, 3, 6, 6), *POOL, order=2)


def test_a_tuple_display_is_several_outputs_not_a_list_output(closures):
    said = check_gradients(closures.topk_display, x(4, 6), 3, order=3)
    assert "backward takes the gradient of output 0 only" in said


def test_a_wrong_backward_is_reported_at_its_return(closures):
    fn = closures.topk_ignores_largest
    check_gradients(fn, x(3, 5), 2, -1, True, order=2)  # largest: right by chance
    report = report_of(fn, x(3, 5), 2, -1, False)
    assert "`topk_ignores_largest`" in report and "wrong gradient at order 1" in report
    assert re.search(
        r"gradient of `self`, order 1, your backward: max abs error [0-9.e+-]+", report
    ), report
    assert "return torch.zeros_like(self).scatter(dim, again, grad_output)" in report


def test_a_backward_right_once_only_is_reported_at_order_2(closures):
    """An integer output before the floating one, through every order."""
    fn = closures.sorted_tanh_detached
    check_gradients(fn, x(2, 4), x(4), order=1)
    report = report_of(fn, x(2, 4), x(4), order=2)
    assert "wrong gradient at order 2, the generated op" in report, report
    assert "your backward is right at first order" in report


def test_the_mixed_order_is_checked_beside_an_integer_output(closures, monkeypatch):
    """An op right at each order alone and wrong mixed with the output (as
    tests/test_checker.py's), with an integer output after it."""

    def op(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = SquaredDistanceUnreduced.apply(x, y)[0]
        return out, ((x - y) ** 2).sum(-1).argmin()

    fn = closures.squared_distance_argmin
    check_gradients(fn, x(4, 5), x(5), order=3)  # the op s2sgrad generates
    monkeypatch.setattr(testing, "generated_op", lambda fn, options: op)
    report = report_of(fn, x(4, 5), x(5), order=3)
    assert "wrong gradient at order 2 mixed with the output" in report, report
    assert "gradient of `y`, order 2 mixed with the output, the generated op" in report


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (lambda i: i + 1, r"output 1, the generated op: \d+ of its 6 values differ"),
        (lambda i: i.to(torch.int32), "dtype torch.int32, expected torch.int64"),
        (lambda i: i[:1], r"shape \(1, 2\), expected \(3, 2\)"),
    ],
)
def test_integer_outputs_of_the_op_are_compared_for_equal_values(
    closures, monkeypatch, wrong, words
):
    def op(self: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.topk(self, k)
        return values, wrong(indices)

    monkeypatch.setattr(testing, "generated_op", lambda fn, options: op)
    report = report_of(closures.topk, x(3, 5), 2)
    assert "`topk`" in report and "wrong output values, the generated op" in report
    assert re.search(words, report), report
    assert "a bug in s2sgrad" in report


def test_a_number_output_of_the_op_is_compared_too(closures, monkeypatch):
    def op(x: torch.Tensor) -> tuple[Any, ...]:
        values, idx = x.max(dim=-1)
        return values, x.shape[-1] + 1, idx

    monkeypatch.setattr(testing, "generated_op", lambda fn, options: op)
    report = report_of(closures.counted, x(3, 5))
    assert "- output 1, the generated op: 6, expected 5" in report, report


@pytest.mark.parametrize(
    ("name", "rest", "line"),
    [("sin_cos", (), "def backward(grad_s):"), ("cast_pair", (F64,), "grad_y")],
)
def test_a_count_that_does_not_fit_is_reported_not_raised(closures, name, rest, line):
    """Two floating-point outputs for one gradient parameter: the op would raise when
    its backward runs; the checker says why, where backward is."""
    report = report_of(getattr(closures, name), x(3, 4), *rest)
    assert re.match(rf"`{name}` \(\S*{MODULE}\.py:\d+\): ", report), report
    assert (
        "its backward takes 1 gradient, one per floating-point output in order, but 2 "
        "of its 2 outputs are floating-point or complex tensors for these inputs "
        "(outputs: 0, 1)" in report
    )
    assert re.search(
        rf"\n  backward: \S*{MODULE}\.py:\d+ \(`.*{re.escape(line)}", report
    )
    assert "give backward one gradient parameter per output" in report


def test_an_integer_input_checks_nothing_and_says_so(closures):
    said = check_gradients(closures.topk, torch.randint(0, 100, (3, 5)), 2)
    assert said.endswith("inputs checked: none"), said


def test_a_surrogate_with_an_integer_output(closures):
    said = check_gradients(closures.sort_ste, 3 * x(3, 5), order=3)
    assert "against the derivative your backward defines" in said, said
    assert "backward takes the gradient of output 1 only" in said


# -- `s2sgrad check` --------------------------------------------------------------------

EXAMPLES = """

S2SGRAD_EXAMPLES = {
    "topk": lambda: (torch.randn(3, 5, dtype=torch.float64), 2),
    "kthvalue": lambda: (torch.randn(3, 5, dtype=torch.float64), 2, 1, False),
    "max_pool2d_with_indices": lambda: (
        torch.randn(2, 3, 6, 6, dtype=torch.float64), [2, 2], [2, 2], [0, 0], [1, 1],
        False,
    ),
    "topk_ignores_largest": lambda: (torch.randn(3, 5, dtype=torch.float64), 2, -1, False),
    "sin_cos": lambda: torch.randn(4, dtype=torch.float64),
}
"""


def test_check_command_on_closures_with_integer_outputs(tmp_path):
    (tmp_path / "ops.py").write_text(SOURCE + EXTRA + EXAMPLES)
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "check", "ops.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    for name in ("topk", "kthvalue", "max_pool2d_with_indices"):
        assert f"ok          ops.py::{name}\n" in run.stdout, run.stdout
    assert "wrong       ops.py::topk_ignores_largest" in run.stdout
    assert "gradient of `self`, order 1, your backward" in run.stdout
    assert "wrong       ops.py::sin_cos" in run.stdout
    assert "its backward takes 1 gradient" in run.stdout
    assert "3 ok, 2 wrong" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.py"]
