"""Lifting: capture kinds, context order, late binding, shadowing and metadata."""

import libcst as cst
import pytest
import torch

from s2sgrad import transform
from s2sgrad.frontend import parse
from s2sgrad.lift import lift
from s2sgrad.options import Options


def lifted(source, name=None):
    diffs = parse(source, "t.py").differentiators
    diff = diffs[0] if name is None else next(d for d in diffs if d.name == name)
    return lift(diff, Options())


def namespace(source):
    ns = {}
    exec(compile(transform(source, "t.py"), "t_grad.py", "exec"), ns)
    closure_ns = {}
    exec(compile(source, "t.py", "exec"), closure_ns)
    return ns, closure_ns


KINDS = '''
import torch

def f(x, w, n: int, *, scale: float = 2.0):
    h = x @ w
    y = torch.tanh(h)
    mask = x > 0
    k = x.shape[0] + n
    def backward(grad):
        g = grad * (1 - y * y) * scale
        return (g @ w.t()) * mask / k, x.t() @ g + h.sum() * 0, None, None
    return y, backward
'''


def test_capture_kinds_and_order_of_first_reference():
    """Tensors first (so `ctx.saved_tensors` is the context's prefix), then the rest;
    each in the order backward first reads them."""
    result = lifted(KINDS)
    assert [(s.name, s.kind) for s in result.context] == [
        ("y", "output"), ("w", "input"), ("mask", "constant"), ("x", "input"),
        ("h", "temporary"), ("scale", "input"), ("k", "constant"),
    ]
    assert [s.name for s in result.context if s.tensor] == ["y", "w", "mask", "x", "h"]
    assert [s.storage for s in result.context][-2:] == ["object", "object"]
    assert result.first_order


def test_metadata_only_use_saves_the_shape_not_the_tensor():
    source = '''
import torch

def total(x, y):
    def backward(grad):
        return grad.expand(x.shape), grad.expand(y.size()) * y.size(0) / y.numel()
    return x.sum() + y.sum(), backward
'''
    result = lifted(source)
    assert [(s.name, s.kind, s.expression) for s in result.context] == [
        ("x_shape", "metadata", "x.shape"), ("y_shape", "metadata", "y.shape"),
        ("y_numel", "metadata", "y.numel()"),
    ]
    text = transform(source, "t.py")
    assert "grad.expand(y_shape) * y_shape[0] / y_numel" in text
    assert "save_for_backward" not in text.split("# The s2sgrad runtime")[0]
    ns, _ = namespace(source)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ns["total"], (x, y))
    assert torch.autograd.gradgradcheck(ns["total"], (x, y))


def test_late_binding_reads_the_final_value_while_the_result_keeps_the_earlier():
    source = '''
import torch

def f(x):
    t = x * 2
    r = t
    def backward(grad):
        return grad * t
    t = x * 3
    return r, backward
'''
    ns, closure = namespace(source)
    x = torch.randn(3, dtype=torch.float64)
    out, bw = closure["f"](x)
    g = torch.randn(3, dtype=torch.float64)
    result, ctx = ns["f_forward"](x)
    torch.testing.assert_close(result, out)
    torch.testing.assert_close(ns["f_backward"](ctx, g), bw(g))
    torch.testing.assert_close(ns["f_backward"](ctx, g), g * x * 3)


def test_shadowing_names_of_backward_are_not_captures_and_ctx_is_renamed():
    source = '''
import torch

def f(x, y):
    grad = x * y
    ctx = y + 1
    def backward(grad):
        x = grad * 2
        return x * y, grad * ctx
    return grad, backward
'''
    result = lifted(source)
    assert [s.name for s in result.context] == ["y", "ctx"]
    text = transform(source, "t.py")
    assert "def f_backward(\n    ctx_1: Context," in text
    assert "grad_ctx: Grad = None" in text
    ns, closure = namespace(source)
    x, y, g = (torch.randn(3, dtype=torch.float64) for _ in range(3))
    _, bw = closure["f"](x, y)
    _, ctx = ns["f_forward"](x, y)
    for a, b in zip(ns["f_backward"](ctx, g), bw(g), strict=True):
        torch.testing.assert_close(a, b)


def test_rebound_parameter_is_a_temporary_not_an_input():
    source = '''
import torch

def f(x):
    x = x * 2
    def backward(grad):
        return grad * 2 * x / x
    return x.clone(), backward
'''
    assert [(s.name, s.kind) for s in lifted(source).context] == [("x", "temporary")]


def test_non_tensor_inputs_get_none_and_the_op_keeps_the_signature():
    source = '''
import torch

def scale(x, factor: float = 2.0, *, bias: float = 0.0):
    def backward(grad):
        return grad * factor, None, None
    return x * factor + bias, backward
'''
    ns, _ = namespace(source)
    import inspect
    # The user's parameters, kinds, defaults and annotations; the rest annotated too.
    params = inspect.signature(ns["scale"]).parameters
    assert [(p.name, p.kind.name, p.default) for p in params.values()] == [
        ("x", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("factor", "POSITIONAL_OR_KEYWORD", 2.0),
        ("bias", "KEYWORD_ONLY", 0.0),
    ]
    assert [p.annotation for p in params.values()] == [torch.Tensor, float, float]
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ns["scale"](t, 3.0, bias=1.0), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ns["scale"](t, 3.0, bias=1.0), (x,))


def test_if_else_in_forward_is_kept():
    source = '''
import torch

def f(x, square: bool):
    if square:
        y = x * x
    else:
        y = x * 3
    def backward(grad):
        return (2 * x if square else torch.full_like(x, 3.0)) * grad, None
    return y, backward
'''
    ns, _ = namespace(source)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    for flag in (True, False):
        assert torch.autograd.gradcheck(lambda t, flag=flag: ns["f"](t, flag), (x,))
        assert torch.autograd.gradgradcheck(lambda t, flag=flag: ns["f"](t, flag), (x,))


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("x", True),
        ("x.contiguous()", True),
        ("x.to(torch.float64)", True),
        ("torch.atleast_1d(x)", True),
        ("F.dropout(x, training=False)", True),
        ("x.mul_(2.0)", True),
        ("+x", True),
        ("x if flag else y", True),
        ("helper(x)", True),
        ("g(x)[0]", True),
        ("x * 2.0", False),
        ("torch.sin(x)", False),
        ("x.transpose(0, 1)", False),
        ("x[0]", False),
        ("-x", False),
        ("x.__neg__()", False),
        ("x.__iadd__(y)", True),
        # Nothing in the op table says these make a new tensor.
        ("torch.asarray(x)", True),
        ("x.as_subclass(torch.Tensor)", True),
        ("x.type(torch.float64)", True),
        ("torch.nn.Identity()(x)", True),
        ("(lambda a: a)(x)", True),
    ],
)
def test_may_return_self(expression, expected):
    """What may be an object that exists already (an input), so is returned as a view."""
    from s2sgrad.lift import may_return_self

    assert may_return_self(cst.parse_expression(expression), {}) is expected
