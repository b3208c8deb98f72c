"""Closures an outside probe wrote across the torch API (201 rules, about 2,000
checks), and what it found in s2sgrad's derivative rules: each case converts and
matches torch.autograd through the closure's own forward at orders 1 to 3, pure and
mixed, in float64 (tests/oracle.py).

Why the tests missed them: each rule was checked on examples where its operands kept
their shapes and dtypes and held no special values. A cast to an integer dtype
passed the truncated gradient on (orders 2-3 wrong); a `masked_fill` mask that
broadcasts its input was taken to keep the input's shape, and its gradient was not
reduced (a crash at call time); `x ** 0` differentiated to `0 * x ** -1`, nan at 0;
a Python base of 0 raised math's ValueError in a double backward.

It also found in-place writes that were not seen as writes: an activation's
`inplace` flag given positionally, a differentiable value written into a buffer
forward made without a gradient (`out=t`, `t[:].copy_(v)`), and a tensor changed
through the list that holds it. Each was run as written while the promoted
temporary's gradient ignored it (orders 2-3 wrong, or the caller's input changed);
they are now written out of place where they can be, else refused (S2S123).
"""

from __future__ import annotations

import pytest
import torch
from oracle import assert_same, derivatives, import_pair, leaves

from s2sgrad import transform
from s2sgrad.diagnostics import TransformError

F64 = torch.float64


def _r(*shape, seed=0):
    return torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _check(closures, generated, values, rest=(), rtol=1e-7):
    def ref(*t):
        return closures.f(*t, *rest)[0]

    def got(*t):
        return generated.f(*t, *rest)

    expected = derivatives(ref, leaves(values))
    assert_same(derivatives(got, leaves(values)), expected, rtol=rtol)


CAST = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    k = x.to(torch.int64)
    kf = k.to(x.dtype)
    t = (x - kf) * w
    def backward(g):
        return g * w, g * (x - kf)
    return t * 1.0, backward
"""

CASTS = {
    "to_int64": CAST,
    "to_bool": CAST.replace("torch.int64", "torch.bool"),
    "to_int64_times_one": CAST.replace("kf = k.to(x.dtype)", "kf = k * 1.0"),
    "type_as_int": CAST.replace(
        "k = x.to(torch.int64)\n    kf = k.to(x.dtype)",
        "k = x.type_as(torch.tensor([1]))\n    kf = k.type_as(x)",
    ),
    "view_as_int64": CAST.replace(
        "k = x.to(torch.int64)\n    kf = k.to(x.dtype)",
        "k = x.view(torch.int64)\n    kf = k.view(torch.float64)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASTS))
def test_a_cast_to_an_integer_dtype_passes_no_gradient(tmp_path, case):
    """`w` broadcast, its gradient returned unreduced; the temporary `t` is promoted
    and its gradient goes back through the casts."""
    closures, generated = import_pair(tmp_path, CASTS[case], f"cast_{case}")
    _check(closures, generated, [_r(3, 4) * 3, _r(4, seed=1)])


MASKED = """import torch


def f(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor):
    mf = x.masked_fill(m, 0.0)
    def backward(g):
        d = 2 * g * mf * (~m).to(g.dtype)
        return (d * w).sum(0), g * mf * mf, None
    return mf * mf * w, backward
"""


def test_a_masked_fill_whose_mask_broadcasts_its_input(tmp_path):
    """x (4,) filled under a (3, 4) mask is (3, 4): x's gradient is reduced, in
    reverse mode and in forward mode (`jacfwd`)."""
    closures, generated = import_pair(tmp_path, MASKED, "masked")
    m = torch.rand(3, 4, generator=torch.Generator().manual_seed(2)) > 0.5
    _check(closures, generated, [_r(4), _r(4, seed=1)], rest=(m,))
    w = _r(4, seed=1)
    jac = torch.func.jacfwd(lambda a: generated.f(a, w, m))(_r(4))
    ref = torch.func.jacrev(lambda a: closures.f(a, w, m)[0])(_r(4))
    torch.testing.assert_close(jac, ref)


POWER = """import torch


def f(x: torch.Tensor, w: torch.Tensor, k: int):
    p = torch.pow(x, k)
    q = p * x
    def backward(g):
        d = (k + 1) * x ** k
        return g * w * d, g * q, None
    return q * w, backward
"""


@pytest.mark.parametrize("k", [0, 1, 3])
def test_a_power_of_zero_where_the_base_is_zero(tmp_path, k):
    """PyTorch's derivative of x ** 0 is 0 (not `0 * x ** -1`, nan at x == 0)."""
    closures, generated = import_pair(tmp_path, POWER, f"power_{k}")
    x = _r(3, 4)
    x.view(-1)[::3] = 0.0
    _check(closures, generated, [x, _r(4, seed=1)], rest=(k,))


KNOWN_POWERS = """import math
import torch


def f(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor):
    p = x.pow(2)
    c = 2.0 ** x
    e = x ** t
    def backward(g):
        gx = g * (2 * x * w + c * math.log(2.0) + t * e / x)
        return gx, g * p, (g * e * torch.log(x)).sum(0)
    return p * w + c + e, backward
"""


def test_a_power_whose_operands_are_known_keeps_one_branch(tmp_path):
    """pow's rule serves tensors and Python numbers both; where the call's operands
    are known (a literal exponent, a literal base, two tensors) the generated code
    keeps only the branch taken: no `isinstance` test on a literal reaches the
    module, and the numbers still match at every order."""
    closures, generated = import_pair(tmp_path, KNOWN_POWERS, "known_powers")
    text = (tmp_path / "known_powers_grad.py").read_text()
    assert "isinstance(" not in text, text
    x = _r(3, 4).abs() + 0.5
    _check(closures, generated, [x, _r(4, seed=1), _r(4, seed=2)])


BASE = """import math
import torch


def f(x: torch.Tensor, w: torch.Tensor, base: float):
    s = base ** x
    t = s * w
    def backward(g):
        ds = s * math.log(base) if base > 0 else torch.zeros_like(s)
        return g * w * ds, g * s, None
    return t * 1.0, backward
"""


def test_a_python_base_of_zero_gives_numbers_at_every_order(tmp_path):
    """0.0 ** x for x > 0 is 0 whatever x: every derivative in x is 0. The rule took
    math.log(0) (a ValueError in the double backward); torch's own double backward
    gives nan there, so the orders past the first are compared with 0."""
    closures, generated = import_pair(tmp_path, BASE, "zero_base")
    values = [_r(3, 4).abs() + 0.5, _r(4, seed=1)]
    got = derivatives(lambda *t: generated.f(*t, 0.0), leaves(values))
    ref = derivatives(lambda *t: closures.f(*t, 0.0)[0], leaves(values))
    torch.testing.assert_close(got.outputs, ref.outputs)
    torch.testing.assert_close(got.pure[0], ref.pure[0])
    for gradients in [*got.pure[1:], *got.mixed]:
        torch.testing.assert_close(gradients[0], torch.zeros(3, 4, dtype=F64))
    positive = derivatives(lambda *t: generated.f(*t, 2.0), leaves(values))
    expected = derivatives(lambda *t: closures.f(*t, 2.0)[0], leaves(values))
    assert_same(positive, expected)


ACTIVATION = """import torch
import torch.nn.functional as F


def f(x: torch.Tensor, w: torch.Tensor):
    t = x * 1.5
    CALL
    y = torch.sin(t) * w
    def backward(g):
        slope = torch.where(x > 0, 1.5, SLOPE)
        return g * w * torch.cos(t) * slope, g * torch.sin(t)
    return y, backward
"""


@pytest.mark.parametrize(
    "call,slope",
    [
        ("F.leaky_relu(t, 0.1, True)", "0.15"),
        ("F.leaky_relu(t, 0.1, inplace=True)", "0.15"),
        ("F.relu(t, True)", "0.0"),
        ("F.hardtanh(t, -0.5, 0.5, True)", "0.0"),
    ],
)
def test_an_activation_made_in_place_by_its_flag_is_written_out_of_place(
    tmp_path, call, slope
):
    """The flag given by position is the flag: `t` changes, and its gradient
    goes back through the activation (w broadcast, its gradient unreduced)."""
    if "hardtanh" in call:
        source = ACTIVATION.replace(
            "torch.where(x > 0, 1.5, SLOPE)",
            "torch.where((t > -0.5) & (t < 0.5), 1.5, 0.0)",
        )
    else:
        source = ACTIVATION.replace("SLOPE", slope)
    source = source.replace("CALL", call)
    closures, generated = import_pair(tmp_path, source, "activation")
    x = _r(3, 4) * 0.3 if "hardtanh" in call else _r(3, 4)
    # Rounding: the op sums w's gradient in another order (about 1e-7 relative).
    _check(closures, generated, [x, _r(4, seed=1)], rtol=1e-6)


WRITTEN = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.zeros_like(x)
    WRITE
    y = t * w
    def backward(g):
        return g * w * 2, g * t
    return y, backward
"""


@pytest.mark.parametrize(
    "write", ["t.add_(x * 2)", "t[:] = x * 2", "t[:].copy_(x * 2)", "t.copy_(x * 2)"]
)
def test_a_buffer_forward_fills_with_a_differentiable_value(tmp_path, write):
    """A buffer made without a gradient and filled with `2 * x` carries x's
    gradient: its own gradient goes back through the fill. (`copy_` was refused,
    having no out-of-place twin; it is the store `t[...] = v`.)"""
    source = WRITTEN.replace("WRITE", write)
    closures, generated = import_pair(tmp_path, source, "written")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1)])


@pytest.mark.parametrize(
    "write,shown",
    [
        ("torch.mul(x, 2, out=t)", "`out=t` changes `t`"),
        ("t[:].copy_(x * 2, non_blocking=True)", "`t[:].copy_(...)` changes `t`"),
    ],
)
def test_a_differentiable_value_written_where_it_cannot_be_rewritten(write, shown):
    """Refused, located: the buffer carries a gradient from that write on (torch
    itself refuses `out=` when an operand requires grad)."""
    with pytest.raises(TransformError) as caught:
        transform(WRITTEN.replace("WRITE", write), "m.py", "m")
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.code, diagnostic.line) == ("S2S123", 6)
    assert diagnostic.message.startswith(shown)


HELD = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    HOLD
    WRITE
    y = torch.exp(x) * w
    def backward(g):
        e = torch.exp(x)
        return g * w * e, g * e
    return y, backward
"""


@pytest.mark.parametrize(
    "hold,write",
    [
        ("t = x * 1.5\n    keep = [t]", "keep[0].mul_(2.0)"),
        ("t = x * 1.5\n    keep = {'a': t}", "keep['a'].mul_(2.0)"),
        ("parts = x.chunk(2, dim=1)", "parts[0].mul_(2.0)"),
        ("parts = list(x.unbind(0))", "parts[1][0] = 0.0"),
    ],
)
def test_a_tensor_changed_through_the_container_holding_it_is_refused(hold, write):
    """The tensor has another name (`t`), or views an input (`x`, whose caller's
    tensor would change): refused at the write, not run as written. A view of the
    input is S2S103, which names the input the write changes."""
    source = HELD.replace("HOLD", hold).replace("WRITE", write)
    with pytest.raises(TransformError) as caught:
        transform(source, "m.py", "m")
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.line == source.splitlines().index(f"    {write}") + 1
    if hold.startswith("parts"):
        assert diagnostic.code == "S2S103"
        assert "the input `x`" in diagnostic.message
    else:
        assert diagnostic.code == "S2S123"
        assert "holds" in diagnostic.message


def test_a_list_forward_fills_by_index_is_still_a_list_it_builds(tmp_path):
    """`hs[i] = h` stores into the list, and changes no tensor: kept as written."""
    source = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    hs = [x, x]
    hs[1] = x * w
    y = hs[0] * hs[1]
    def backward(g):
        return 2 * g * x * w, g * x * x
    return y, backward
"""
    closures, generated = import_pair(tmp_path, source, "filled")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1)])


HANDED_BACK = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = x * 1.5
    u = CALL
    u.mul_(2.0)
    y = torch.sin(t) * w
    def backward(g):
        return g * w * torch.cos(t) * 3.0, g * torch.sin(t)
    return y, backward
"""


@pytest.mark.parametrize(
    "call",
    [
        "torch.asarray(t)",
        "t.as_subclass(torch.Tensor)",
        "torch.nn.Identity()(t)",
        "(lambda a: a)(t)",
        "t.type(torch.float64)",
        "getattr(t, 'contiguous')()",
        "max([t], key=lambda a: 0)",
    ],
)
def test_a_write_through_a_call_that_may_hand_its_argument_back(call):
    """`u = torch.asarray(t)` is `t` itself: `u.mul_(2.0)` doubles `t`. It was
    written `u = u.mul(2.0)` (the op's output wrong), or kept while `t`'s gradient
    ignored it. Nothing in the op table says these make a new tensor: refused."""
    with pytest.raises(TransformError) as caught:
        transform(HANDED_BACK.replace("CALL", call), "m.py", "m")
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.code, diagnostic.line) == ("S2S123", 7)


@pytest.mark.parametrize("call", ["t * 1.0", "t.clone()", "torch.exp(t)"])
def test_a_write_to_a_new_tensor_is_written_out_of_place(tmp_path, call):
    source = HANDED_BACK.replace("CALL", call).replace(" * 3.0", " * 1.5")
    closures, generated = import_pair(tmp_path, source, "fresh")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1)])


SHARED = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    h = x * w
    HOLD
    h += 1.0
    t = torch.sin(h) * hs[0]
    def backward(g):
        d = g * (torch.cos(h) * hs[0] + torch.sin(h))
        return d * w, d * x
    return t, backward
"""


@pytest.mark.parametrize(
    "hold",
    [
        "hs = [None]\n    hs[0] = h",
        "hs = [v for v in (h,)]",
        "hs = list((h,))",
        "hs = tuple([h])",
        "hs = [h] * 2",
        "hs = []\n    hs += [h]",
    ],
)
def test_an_in_place_change_of_a_tensor_a_container_holds(hold):
    """`hs` holds `h`'s very tensor, so `h += 1.0` changes `hs[0]` too; written
    `h = h + 1.0` it did not (output and gradients wrong). Refused at the write."""
    source = SHARED.replace("HOLD", hold)
    with pytest.raises(TransformError) as caught:
        transform(source, "m.py", "m")
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "S2S123"
    assert diagnostic.line == source.splitlines().index("    h += 1.0") + 1


# -- a third probe of the rules (probe C): special values, overloads, implicit dims ---

PROBE_C = {
    # torch sends the gradient to `hi` alone where lo > hi, and to neither bound where
    # x < lo == hi; the rule sent it to both bounds (orders 2-3 wrong).
    "clamp_crossed_bounds": (
        """import torch


def f(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, w: torch.Tensor):
    t = torch.clamp(x, lo, hi)
    def backward(g):
        inside = (x >= lo) & (x <= hi)
        d = g * w
        return (
            torch.where(inside, d, 0.0),
            torch.where((x < lo) & (lo < hi), d, 0.0),
            torch.where((x > hi) | (hi < lo), d, 0.0),
            g * t,
        )
    return t * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1) + 0.5, _r(4, seed=2) - 0.5, _r(4, seed=3)],
    ),
    # `torch.var(x, False)` is the `unbiased` overload: the bool was bound to `dim`
    # (a crash at order 2).
    "var_unbiased_by_position": (
        """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.var(x, False)
    def backward(g):
        n = x.numel()
        return (g * w).sum() * 2.0 * (x - x.mean()) / n, g * t
    return t * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1)],
    ),
    # F.softmax's `dim=None` is an implicit dim (1 for 2-D input); the rule summed
    # over every element (orders 2-3 wrong).
    "softmax_implicit_dim": (
        """import torch
import torch.nn.functional as F


def f(x: torch.Tensor, w: torch.Tensor):
    t = F.softmax(x, dim=None)
    u = F.log_softmax(x, None)
    def backward(g):
        gt = g * w
        gs = t * (gt - (gt * t).sum(1, keepdim=True))
        gl = gt - torch.exp(u) * gt.sum(1, keepdim=True)
        return gs + gl, g * (t + u)
    return (t + u) * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1)],
    ),
    # The VJP of `x.to(w)` read `x_dtype`, an entry dropped because backward reads
    # x itself (an internal error at conversion).
    "to_other_and_dtype_read": (
        """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = x.to(w)
    def backward(g):
        return (g * w).to(x.dtype), g * t
    return t * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1)],
    ),
    # torch.cat skips a legacy empty (0,) operand; the rule read its shape[1] (an
    # IndexError at order 2).
    "cat_legacy_empty": (
        """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    acc = torch.zeros(0, dtype=x.dtype)
    t = torch.cat([x, acc], 1)
    def backward(g):
        return g * w, g * t
    return t * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1)],
    ),
    # dropout with a literal `training=False` draws nothing: it was refused (S2S121).
    "dropout_not_training": (
        """import torch
import torch.nn.functional as F


def f(x: torch.Tensor, w: torch.Tensor):
    t = F.dropout(x, 0.5, training=False)
    u = torch.dropout(x, 0.5, False)
    def backward(g):
        return 2.0 * g * w, g * (t + u)
    return (t + u) * w, backward
""",
        lambda: [_r(3, 4), _r(4, seed=1)],
    ),
}


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
@pytest.mark.parametrize("case", sorted(PROBE_C))
def test_probe_c_rules(tmp_path, case):
    """Each converts and matches autograd through the closure at orders 1-3, pure and
    mixed, with `w` broadcast and its gradient returned unreduced."""
    source, values = PROBE_C[case]
    closures, generated = import_pair(tmp_path, source, f"probe_c_{case}")
    _check(closures, generated, values())


def test_a_tensor_base_of_zero_gives_the_exponent_no_gradient(tmp_path):
    """pow_backward_exponent: where x == 0 and the exponent is not negative, the
    exponent has no gradient; the rule's `out * log(x)` was 0 * -inf = nan there, and
    the nan reached w's third order (autograd's is finite). Where torch's own
    derivatives in x and e are nan (its arithmetic at 0), they are not compared."""
    source = """import torch


def f(x: torch.Tensor, e: torch.Tensor, w: torch.Tensor):
    t = x ** e
    def backward(g):
        log_x = torch.log(torch.where(x == 0, 1.0, x))
        return g * w * e * x ** (e - 1), g * w * t * log_x, g * t
    return t * w, backward
"""
    closures, generated = import_pair(tmp_path, source, "pow_zero_tensor_base")
    values = [
        torch.tensor([0.0, 0.5, 2.0], dtype=F64),
        torch.tensor([3.5, 4.0, 4.5], dtype=F64),
        torch.tensor([1.0, -0.5, 0.25], dtype=F64),
    ]
    got = derivatives(lambda *t: generated.f(*t), leaves(values))
    expected = derivatives(lambda *t: closures.f(*t)[0], leaves(values))
    for label, mine, theirs in got.pairs(expected):
        if label.endswith("input 2") or label.startswith("output"):
            assert torch.isfinite(theirs).all(), label
        known = torch.isfinite(theirs)
        torch.testing.assert_close(
            mine[known], theirs[known], rtol=1e-7, atol=1e-9, msg=label
        )


TRACED = """import torch


def swish_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    h = x @ w + b
    s = torch.sigmoid(h)
    def backward(grad):
        gh = grad * (s + h * s * (1 - s))
        return gh @ w.t(), x.t() @ gh, gh
    return h * s, backward


def tanh_scale(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x * w)
    def backward(grad):
        gt = grad * (1 - t * t)
        return gt * w, gt * x
    return t, backward
"""


def test_torch_jit_trace_records_an_op_or_says_why_it_cannot():
    """An outside probe traced a model with torch.jit.trace: an op whose Function
    hands a size from forward to backward as an extra output (the shape the promoted
    `h`'s matmul rule reads) failed where the trace replayed it, with no
    word of which op. It now raises where it is traced, naming the Function; an op
    whose outputs are all tensors still traces and runs."""
    import warnings

    import torch

    namespace: dict[str, object] = {"__name__": "traced_grad"}
    exec(compile(transform(TRACED, "traced.py"), "traced_grad.py", "exec"), namespace)
    x = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    swish_linear, tanh_scale = namespace["swish_linear"], namespace["tanh_scale"]
    w, c = torch.randn(4, 5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="torch.jit.trace cannot record"):
            torch.jit.trace(lambda v: swish_linear(v, w, c), (x,))  # type: ignore[operator]
        traced = torch.jit.trace(lambda v: tanh_scale(v, b), (x,))  # type: ignore[operator]
    v = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(traced(v).sum(), v)
    u = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(torch.tanh(u * b).sum(), u)
    torch.testing.assert_close(got, want)
