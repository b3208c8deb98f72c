"""Gradient penalties through generated ops whose parameters broadcast (issue 22).

What broke: an R1/WGAN-GP loss, `out + (grad ** 2).sum()`, through the op of
`samples/temporary.py`'s `squared_distance(x, y)` with x (4, 5) and y (5,) gave y a
wrong gradient. The closure returns y's gradient unreduced, (4, 5), as PyTorch allows;
the generated backward added the promoted temporary `d`'s contribution, already reduced
to (5,), which broadcast and was counted once per row. Only a loss that holds the output
and a gradient at once sends the op's backward both gradients in one call, and only a
parameter broadcast across rows makes the two contributions meet at different shapes;
no test had both. Each test here is named after that: the loss of the issue, compared
with the same loss through the closure's own forward, and the generated backward called
directly with both gradients.
"""

import pytest
import torch

from samples import attention, attention_grad, temporary, temporary_grad

F64 = torch.float64
ROWS = (1, 2, 4)


def r(*shape):
    return torch.randn(shape, dtype=F64)


#: (closure, op, inputs for `rows` rows, index of the broadcast parameter whose
#: gradient the loss penalizes).
PENALIZED = {
    "squared_distance": (
        temporary.squared_distance,
        temporary_grad.squared_distance,
        lambda rows: (r(rows, 5), r(5)),
        1,
    ),
    "add_mul_broadcast_b": (
        temporary.add_mul,
        temporary_grad.add_mul,
        lambda rows: (r(rows, 4), r(4)),
        1,
    ),
    "attention_shared_kv": (
        attention.attention,
        attention_grad.attention,
        lambda rows: (r(rows, 3, 4), r(5, 4), r(5, 6)),
        1,
    ),
}


def _penalized_gradients(fn, inputs, penalized):
    """d/d inputs of `out.sum() + (g ** 2).sum()`, g the gradient of `out.sum()` with
    respect to the penalized input: the R1 / WGAN-GP loss of the issue."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    grads = torch.autograd.grad(out.sum(), inputs, create_graph=True)
    loss = out.sum() + (grads[penalized] ** 2).sum()
    return torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("name", sorted(PENALIZED))
def test_gradient_penalty_through_a_broadcast_parameter_matches_the_closure(name, rows):
    """The op's gradients of a gradient-penalty loss equal autograd's through the
    closure's own forward, for a parameter shared by every row (at one row nothing
    broadcasts: the case the old code got right)."""
    closure, op, inputs, penalized = PENALIZED[name]
    torch.manual_seed(rows)
    values = inputs(rows)
    got = _penalized_gradients(op, values, penalized)
    expected = _penalized_gradients(lambda *a: closure(*a)[0], values, penalized)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == values[i].shape, f"input {i}: shape {tuple(g.shape)}"
        torch.testing.assert_close(
            g, e, rtol=1e-7, atol=1e-9, msg=lambda m, i=i: f"{name}, input {i}: {m}"
        )


def test_backward_sums_an_unreduced_gradient_to_its_input_shape_when_contributions_meet():
    """`squared_distance_backward` given the output's gradient and `d`'s together: the
    closure's `-g` for y is (4, 5), `d`'s contribution is reduced to (5,), and y's
    gradient is their sum at y's shape, each counted once."""
    torch.manual_seed(0)
    x, y = r(4, 5), r(5)
    grad, grad_d = r(), r(4, 5)
    with torch.no_grad():
        _, ctx = temporary_grad.squared_distance_forward(x, y)
        grad_x, grad_y = temporary_grad.squared_distance_backward(
            ctx, grad, grad_d=grad_d
        )
    d = x - y
    assert grad_y is not None
    assert grad_y.shape == y.shape, f"y's gradient has shape {tuple(grad_y.shape)}"
    assert grad_x.shape == x.shape
    torch.testing.assert_close(grad_y, (-2.0 * grad * d - grad_d).sum(0))
    torch.testing.assert_close(grad_x, 2.0 * grad * d + grad_d)
