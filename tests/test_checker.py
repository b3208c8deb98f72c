"""`s2sgrad.testing.check_gradients` and `s2sgrad check`: quiet on right rules (every
sample), and a report a user can act on for each kind of wrong one."""

import re
import subprocess
import sys
import textwrap

import checker_rules as rules
import checker_star_rules
import pytest
import torch
from sample_cases import CASES, load

from s2sgrad import testing
from s2sgrad.diagnostics import TransformError
from s2sgrad.testing import check_gradients


def r(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


def report_of(fn, *args, order=2, **kwargs):
    with pytest.raises(AssertionError) as caught:
        check_gradients(fn, *args, order=order, **kwargs)
    return str(caught.value)


def line_of(fn, text):
    """The line in checker_rules.py that holds `text`, inside `fn`."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize(
    "module,name,factory",
    [pytest.param(*c[:2], c[3], id=f"{c[0]}.{c[1]}[{c[2]}]") for c in CASES],
)
def test_quiet_on_every_sample(module, name, factory):
    torch.manual_seed(0)
    args, kwargs = factory()
    check_gradients(load(module, name), *args, order=2, **kwargs)


def test_quiet_on_right_rules_with_lists_several_outputs_and_plain_values():
    check_gradients(rules.swiglu, r(3, 4), r(4, 5), r(4, 5), order=3)
    check_gradients(rules.scaled_sum, [r(3), r(3), r(3)], r(3), 0.5, order=2)
    check_gradients(rules.scaled_sum, [r(3)], r(3), 2.0, order=3)
    check_gradients(rules.sincos, r(2, 3), order=3)
    check_gradients(rules.bias_unreduced, r(3, 4), r(4))


def test_quiet_on_a_forward_that_draws_random_numbers():
    """The op and the closure each run forward from the same random state, and the
    caller's random state is left as it was."""
    torch.manual_seed(5)
    x = r(6, 7)
    before = torch.random.get_rng_state()
    check_gradients(rules.dropout, x, 0.4, order=3)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_missing_term():
    report = report_of(rules.swiglu_missing_term, r(3, 4), r(4, 5), r(4, 5))
    assert "`swiglu_missing_term`" in report and "checker_rules.py:" in report
    assert "gradient of `x`, order 1, your backward" in report
    assert re.search(
        r"max abs error [0-9.e+-]+, max rel error [0-9.e+-]+ \(shape \(3, 4\)\)", report
    )
    at = line_of(rules.swiglu_missing_term, "return gx, x.t() @ da")
    assert f"checker_rules.py:{at} (`return gx, x.t() @ da, x.t() @ db`)" in report
    assert "`w`" not in report and "`v`" not in report  # only what is wrong


def test_a_wrong_sign():
    report = report_of(rules.mul_wrong_sign, r(3, 4), r(3, 4))
    assert "gradient of `y`, order 1" in report and "gradient of `x`" not in report


def test_a_wrong_broadcast_reduction():
    report = report_of(rules.bias_wrong_reduction, r(4, 4), r(4))
    assert "gradient of `b`, order 1, your backward: max abs error" in report
    report = report_of(rules.bias_wrong_reduction, r(3, 4), r(4))
    assert (
        "gradient of `b`, order 1, your backward: shape (3,), expected (4,)" in report
    )


@pytest.mark.parametrize(
    "fn", [rules.exp_detached, rules.exp_data], ids=["detach", "data"]
)
def test_right_once_but_not_twice_differentiable(fn):
    check_gradients(fn, r(3, 4), order=1)  # right at first order
    report = report_of(fn, r(3, 4), order=2)
    assert "gradient of `x`, order 2, the generated op" in report
    assert "your backward is right at first order" in report


def test_a_wrong_list_element_and_a_wrong_second_output():
    report = report_of(rules.scaled_sum_wrong_element, [r(3), r(3), r(3)], r(3), 0.5)
    assert "gradient of `xs[2]`, order 1" in report
    assert "`xs[0]`" not in report and "`xs[1]`" not in report
    report = report_of(rules.sincos_wrong, r(2, 3))
    assert "gradient of `x`, order 1" in report


def test_star_grads_backward_is_checked_with_one_gradient_per_output():
    report = report_of(checker_star_rules.sincos_star_wrong, r(2, 3), order=1)
    assert "gradient of `x`, order 1, your backward: max abs error" in report


def test_gradients_listed_in_a_list_are_read_per_parameter():
    check_gradients(rules.mul_listed, r(2, 3), r(2, 3), order=3)


def test_a_lone_list_parameter_may_get_its_gradients_bare():
    check_gradients(rules.pair_product, (r(3), r(3)), order=2)
    check_gradients(rules.total, [r(3), r(3), r(3)], order=2)


def test_float32_inputs_use_the_same_oracle():
    check_gradients(
        rules.swiglu,
        r(3, 4, dtype=torch.float32),
        r(4, 5, dtype=torch.float32),
        r(4, 5, dtype=torch.float32),
    )
    report_of(
        rules.mul_wrong_sign, r(3, dtype=torch.float32), r(3, dtype=torch.float32)
    )


# -- which inputs are checked ------------------------------------------------------------


def test_inputs_that_do_not_require_grad_may_have_no_gradient():
    """As gradcheck chooses: the tensors that require grad. Constant tables and float
    targets, whose backward gives None, are not checked; where the examples mark no
    tensor, every floating-point one is."""
    x = r(2, 3, 8)
    done = check_gradients(rules.rope, x.requires_grad_(), r(3, 8), r(3, 8))
    assert done.endswith("inputs checked: `x`")
    targets = torch.rand(4, 5, dtype=torch.float64)
    check_gradients(rules.focal_loss, r(4, 5).requires_grad_(), targets, 2.0)
    report = report_of(rules.rope, x.detach(), r(3, 8), r(3, 8))
    assert "gradient of `cos`, order 1, your backward: no gradient (None)" in report
    report = report_of(rules.focal_loss, r(4, 5), targets.requires_grad_(), 2.0)
    assert "gradient of `targets`, order 1" in report and "`logits`" not in report


# -- a backward meant to differ from forward's derivative --------------------------------


def test_an_undeclared_straight_through_estimator_is_wrong():
    report = report_of(rules.round_ste, 2 * r(4, 5))
    assert "against torch.autograd through the closure's own forward" in report
    assert "gradient of `x`, order 1, your backward: max abs error " in report


def test_a_declared_straight_through_estimator_is_checked_against_its_backward():
    """`# s2sgrad: surrogate=true`: the op against the derivative backward defines, at
    every order, in reverse and forward mode (its jvp the transpose of backward)."""
    done = check_gradients(rules.round_ste_declared, 2 * r(4, 5), order=3)
    assert "orders 1 to 3 (each alone and mixed with the output)" in done
    assert "in reverse and forward mode" in done
    assert "against the derivative your backward defines" in done
    assert "(`# s2sgrad: surrogate=true`)" in done
    check_gradients(rules.spike, r(4, 5), order=2)


def test_a_surrogate_that_reads_its_own_outputs_is_right():
    """The op differentiates an output its backward reads with that backward (it is
    the op's output); the reference must too, not with forward's derivative."""
    done = check_gradients(rules.sincos_surrogate, r(4), order=3)
    assert "against the derivative your backward defines" in done


def test_a_surrogate_not_linear_in_its_gradient_is_named_as_the_cause():
    """Forward mode is the transpose of backward: a clipped gradient has none that
    agrees, and the report says why rather than blaming the op alone."""
    report = report_of(rules.clip_gradient, r(4, 5))
    assert "forward mode" in report
    assert "linear in its incoming gradient" in report


class SpikeDetached(torch.autograd.Function):
    """An op for `rules.spike` that is right once: it keeps the sigmoid outside
    autograd, so that its backward's own derivative is 0."""

    @staticmethod
    def forward(ctx, x):
        ctx.s = torch.sigmoid(4 * x)
        return (x > 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad * 4 * ctx.s * (1 - ctx.s)


def test_a_surrogate_whose_op_is_wrong_at_order_2_is_caught(monkeypatch):
    monkeypatch.setattr(
        testing, "generated_op", lambda fn, options: SpikeDetached.apply
    )
    report = report_of(rules.spike, r(4, 5))
    assert (
        "wrong gradient at order 2, the generated op against the derivative your "
        "backward defines (`# s2sgrad: surrogate=true`), at every order" in report
    )
    assert "gradient of `x`, order 2, the generated op: max abs error" in report
    assert "differs from your backward's own derivative" in report


def test_a_misspelt_surrogate_pragma_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "misspelt_ops.py").write_text(
        "import torch\n\n\ndef ste(x):\n    # s2sgrad: surogate=true\n"
        "    def backward(grad):\n        return grad\n    return torch.round(x), backward\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import misspelt_ops

    with pytest.raises(TransformError) as caught:
        check_gradients(misspelt_ops.ste, r(3))
    assert "S2S122" in str(caught.value) and "did you mean `surrogate`?" in str(
        caught.value
    )


# -- honest figures, every shape of loss and forward mode --------------------------------


def test_an_error_where_0_is_expected_is_absolute_beside_the_scale():
    report = report_of(rules.relu_identity, r(4, 5))
    assert re.search(
        r"max abs error [0-9.e+-]+ where 0 is expected "
        r"\(largest expected magnitude [0-9.e+-]+; shape \(4, 5\)\)",
        report,
    ), report
    assert "max rel error" not in report and "e+30" not in report
    report = report_of(rules.relu_doubled, r(4, 5))
    assert re.search(
        r"max abs error [0-9.e+-]+, max rel error 1 \(0 is expected at some wrong "
        r"entries; largest expected magnitude [0-9.e+-]+; shape \(4, 5\)\)",
        report,
    ), report
    report = report_of(rules.round_ste, 2 * r(4, 5))
    assert "where 0 is expected (largest expected magnitude 0; shape (4, 5))" in report


def _add(total, grad):
    return total if grad is None else grad if total is None else total + grad


class SquaredDistanceUnreduced(torch.autograd.Function):
    """s2sgrad's op for `rules.squared_distance` before its fix: the temporary d is
    a second output, and backward added d's gradient, reduced to y's shape, to the
    closure's unreduced one, so that it counted once per row of x."""

    @staticmethod
    def forward(ctx, x, y):
        d = x - y
        ctx.save_for_backward(d)
        ctx.shapes = x.shape, y.shape
        ctx.set_materialize_grads(False)
        return (d * d).sum(), d

    @staticmethod
    def backward(ctx, grad, grad_d):
        (d,) = ctx.saved_tensors
        x_shape, y_shape = ctx.shapes
        g = grad_y = None
        if grad is not None:
            g = 2.0 * grad * d
            grad_y = -g
        if grad_d is not None:
            g = _add(g, grad_d.sum_to_size(x_shape))
            grad_y = _add(grad_y, (-grad_d).sum_to_size(y_shape))
        return g, grad_y


def test_a_gradient_wrong_only_mixed_with_the_output(monkeypatch):
    monkeypatch.setattr(
        testing,
        "generated_op",
        lambda fn, options: lambda x, y: SquaredDistanceUnreduced.apply(x, y)[0],
    )
    report = report_of(rules.squared_distance, r(4, 5), r(5), order=3)
    assert (
        "wrong gradient at order 2 mixed with the output (one backward of "
        "sum(w * out) + sum(v * grad), as a gradient penalty takes it)" in report
    )
    assert "gradient of `y`, order 2 mixed with the output, the generated op" in report
    assert "`x`" not in report and "each order alone is right" in report


def test_a_broadcast_parameter_unreduced_is_right_mixed_with_the_output():
    check_gradients(rules.squared_distance, r(4, 5), r(5), order=3)


class SquareWrongJvp(torch.autograd.Function):
    """x * x with a right backward and a wrong jvp (3 x t)."""

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad * ctx.saved_tensors[0]

    @staticmethod
    def jvp(ctx, t):
        return 3 * t * ctx.saved_tensors[0]


def test_a_wrong_forward_mode_is_caught(monkeypatch):
    monkeypatch.setattr(
        testing, "generated_op", lambda fn, options: SquareWrongJvp.apply
    )
    report = report_of(rules.square, r(3, 4), order=1)
    assert "wrong gradient at order 1 in forward mode" in report
    assert re.search(
        r"gradient of `x`, order 1 in forward mode, the generated op: "
        r"sum\(u \* jvp\(t\)\) = [0-9.e+-]+, sum\(vjp\(u\) \* t\) = [0-9.e+-]+",
        report,
    ), report
    assert "reverse mode is right at every order" in report


# -- `s2sgrad check` -------------------------------------------------------------------

OPS = """
import torch


def scale(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        return g * w, (g * x).sum(0)
    return x * w, backward


def wrong(x: torch.Tensor):
    def backward(g):
        return g
    return x * x, backward


def unchecked(x: torch.Tensor):
    def backward(g):
        return g
    return x + 1, backward


def declared(x: torch.Tensor):  # s2sgrad: surrogate=true
    def backward(g):
        return 3 * g
    return 3 * x, backward


S2SGRAD_EXAMPLES = {
    "scale": lambda: (torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)),
    "wrong": lambda: ((torch.randn(3, dtype=torch.float64),), {}),
    "declared": lambda: torch.randn(3, dtype=torch.float64),
}
"""


def s2sgrad(*args, cwd, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "s2sgrad", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=300,
    )


def test_check_command_reports_each_differentiator(tmp_path):
    (tmp_path / "ops.py").write_text(OPS)
    run = s2sgrad("check", "ops.py", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "ok          ops.py::scale" in run.stdout
    assert "wrong       ops.py::wrong" in run.stdout
    assert "gradient of `x`, order 1, your backward" in run.stdout
    assert "ops.py:13 (`return g`)" in run.stdout
    assert "no examples ops.py::unchecked" in run.stdout
    assert (
        "ok          ops.py::declared (against its own backward: "
        "`# s2sgrad: surrogate=true`)" in run.stdout
    )
    assert "2 ok, 1 wrong, 1 no examples" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.py"]  # nothing written
    quiet = s2sgrad("check", "-q", "ops.py", cwd=tmp_path)
    assert quiet.returncode == 1 and quiet.stderr == ""
    assert (
        "ops.py::scale" not in quiet.stdout
        and "wrong       ops.py::wrong" in quiet.stdout
    )
    fixed = OPS.replace(
        "        return g\n    return x * x",
        "        return 2 * g * x\n    return x * x",
    )
    (tmp_path / "ops.py").write_text(fixed)
    run = s2sgrad("check", "-v", "--order", "3", ".", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok          ops.py::wrong" in run.stdout and "up to order 3" in run.stderr
    assert "ops.py: 4 differentiator(s) in" in run.stderr


def test_check_command_on_the_samples_declaring_examples():
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    run = s2sgrad("check", "-q", "samples/normalization.py", cwd=root)
    assert run.returncode == 0 and run.stdout == "" and run.stderr == "", run
    run = s2sgrad("check", "samples/normalization.py", "samples/temporary.py", cwd=root)
    assert "ok          samples/normalization.py::layer_norm" in run.stdout
    assert "ok          samples/normalization.py::rms_norm" in run.stdout
    assert "no examples samples/temporary.py::add_mul" in run.stdout


@pytest.mark.parametrize(
    "table,message",
    [
        (
            'S2SGRAD_EXAMPLES = {"nope": lambda: ()}',
            "names `nope`, which is not a differentiator",
        ),
        ("S2SGRAD_EXAMPLES = [1]", "must be a dict"),
    ],
)
def test_check_command_rejects_a_bad_table(tmp_path, table, message):
    (tmp_path / "ops.py").write_text(OPS.split("S2SGRAD_EXAMPLES")[0] + table + "\n")
    run = s2sgrad("check", "ops.py", cwd=tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_check_command_reports_every_file_it_cannot_read(tmp_path):
    """`s2sgrad check .` stopped at the first file it could not parse and said
    nothing of the others; each is reported now, in order, and the good ones run."""
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "a_bad.py").write_text("def f(x):\n    return x *\n")
    (tmp_path / "z_bad.py").write_bytes(b"# caf\xe9\n")
    run = s2sgrad("check", ".", cwd=tmp_path)
    assert run.returncode == 2, run
    assert run.stderr.index("a_bad.py:2:") < run.stderr.index("z_bad.py:1:"), run
    assert "s2sgrad: 2 file(s) failed" in run.stderr, run
    assert "ok          ops.py::scale" in run.stdout, run


def test_check_command_reports_an_example_that_raises(tmp_path):
    (tmp_path / "ops.py").write_text(
        OPS.split("S2SGRAD_EXAMPLES")[0]
        + 'S2SGRAD_EXAMPLES = {"scale": lambda: (torch.ones(2), torch.ones(3))}\n'
    )
    run = s2sgrad("check", "ops.py", cwd=tmp_path)
    assert run.returncode == 2
    assert "error       ops.py::scale" in run.stdout and "RuntimeError" in run.stdout


# -- command-line manners --------------------------------------------------------------


def test_version_quiet_verbose_and_stdin(tmp_path):
    from s2sgrad import __version__

    run = s2sgrad("--version", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == f"s2sgrad {__version__}"
    source = textwrap.dedent(OPS.split("S2SGRAD_EXAMPLES")[0])
    run = s2sgrad("convert", "-", cwd=tmp_path, stdin=source)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("# Generated by s2sgrad from <stdin>.")
    assert "def scale(x: Tensor, w: Tensor) -> Tensor:" in run.stdout
    assert list(tmp_path.iterdir()) == []
    run = s2sgrad("convert", "-", cwd=tmp_path, stdin="def f(x):\n    return x, None\n")
    assert run.returncode == 2 and "<stdin>:" in run.stderr and run.stdout == ""
    run = s2sgrad("convert", "-", "--check", cwd=tmp_path, stdin=source)
    assert run.returncode == 2 and "goes alone" in run.stderr
    (tmp_path / "ops.py").write_text(source)
    run = s2sgrad("convert", "-q", "ops.py", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == ""
    run = s2sgrad("-v", "convert", "ops.py", cwd=tmp_path)
    assert "unchanged ops_grad.py" in run.stderr and "generated lines" in run.stderr
    run = s2sgrad("convert", "--check", "-q", "ops.py", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == ""
    run = s2sgrad("review", "-q", "ops.py", "--html", "r.html", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "" and (tmp_path / "r.html").is_file()
    (tmp_path / "main.py").write_text("import ops_grad\n")
    (tmp_path / "ops_grad.py").unlink()
    run = s2sgrad("run", "-v", "main.py", cwd=tmp_path)
    assert run.returncode == 0 and "s2sgrad: import ops_grad:" in run.stderr, run.stderr
    run = s2sgrad("-q", "run", "main.py", cwd=tmp_path)
    assert run.returncode == 0 and "s2sgrad: import" not in run.stderr


def test_a_nan_where_a_number_is_expected_is_wrong():
    """An outside probe: the entry-wise test `error > tolerance` is False for NaN, so
    a NaN second derivative where autograd gives 0 passed reverse mode, and the
    report then said "reverse mode is right at every order"."""
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    report = report_of(rules.relu_squared_root, x, order=2)
    assert "gradient of `x`, order 2, the generated op: max abs error nan" in report
    assert "reverse mode is right" not in report


def test_where_the_reference_is_nan_a_number_is_not_judged():
    """A second outside probe: the NaN test above also called the classic safe sqrt
    wrong, where autograd through its forward gives NaN (0 * inf through the branch
    of the `where` not taken) and the rule gives the true 0. The reference says
    nothing there."""
    x = torch.tensor([-1.0, 0.25, 4.0], dtype=torch.float64)
    check_gradients(rules.safe_sqrt, x, order=2)

