"""Closure-style rules for tests/test_checker.py: right ones, and each kind of wrong one.

A module on disk (not an exec'd string), as a user's would be: the checker reads its
source for the generated op and for the lines it reports.
"""


import torch


def swiglu(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor):
    a = x @ w
    b = x @ v
    s = torch.sigmoid(a)
    silu = a * s
    out = silu * b

    def backward(g):
        db = g * silu
        da = g * b * (s + a * s * (1 - s))
        return da @ w.t() + db @ v.t(), x.t() @ da, x.t() @ db

    return out, backward


def swiglu_missing_term(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor):
    a = x @ w
    b = x @ v
    s = torch.sigmoid(a)
    silu = a * s
    out = silu * b

    def backward(g):
        db = g * silu
        da = g * b * (s + a * s * (1 - s))
        gx = da @ w.t()  # forgot `+ db @ v.t()`
        return gx, x.t() @ da, x.t() @ db

    return out, backward


def mul_wrong_sign(x: torch.Tensor, y: torch.Tensor):
    def backward(g):
        return g * y, -g * x

    return x * y, backward


def bias_wrong_reduction(x: torch.Tensor, b: torch.Tensor):
    def backward(g):
        return g, g.sum(1)  # b broadcasts along dim 0: should be g.sum(0)

    return x + b, backward


def bias_unreduced(x: torch.Tensor, b: torch.Tensor):
    def backward(g):
        return g, g  # torch.autograd sums it to b's shape: right

    return x + b, backward


def exp_detached(x: torch.Tensor):
    y = torch.exp(x)

    def backward(g):
        return g * y.detach()

    return y, backward


def exp_data(x: torch.Tensor):
    y = torch.exp(x)

    def backward(g):
        return g * y.data

    return y, backward


def scaled_sum(xs: list[torch.Tensor], w: torch.Tensor, scale: float):
    total = torch.stack(xs).sum(0)
    out = total * w * scale

    def backward(g):
        gx = g * w * scale
        return [gx for _ in xs], (g * total * scale).sum_to_size(w.shape), None

    return out, backward


def scaled_sum_wrong_element(xs: list[torch.Tensor], w: torch.Tensor, scale: float):
    total = torch.stack(xs).sum(0)
    out = total * w * scale

    def backward(g):
        gx = g * w * scale
        grads = [gx for _ in xs]
        grads[-1] = gx * 2
        return grads, (g * total * scale).sum_to_size(w.shape), None

    return out, backward


def sincos(x: torch.Tensor):
    s, c = torch.sin(x), torch.cos(x)

    def backward(gs, gc):
        return gs * c - gc * s

    return s, c, backward


def sincos_wrong(x: torch.Tensor):
    s, c = torch.sin(x), torch.cos(x)

    def backward(gs, gc):
        return gs * c + gc * s

    return s, c, backward


def mul_listed(x: torch.Tensor, y: torch.Tensor):
    """x * y; backward lists its gradients in a list."""
    def backward(grad):
        return [grad * y, grad * x]
    return x * y, backward


def pair_product(xs: tuple[torch.Tensor, ...]):
    """a * b of a pair; backward returns the pair's gradients bare."""
    a, b = xs
    def backward(grad):
        return (grad * b, grad * a)
    return a * b, backward


def total(xs: list[torch.Tensor]):
    """The sum of a list; backward returns its gradients as a generator."""
    def backward(grad):
        return (grad for _ in xs)
    return torch.stack(xs).sum(0), backward


def dropout(x: torch.Tensor, p: float):
    """Draws its mask in forward: the op and the closure must draw the same one."""
    mask = torch.empty_like(x)
    mask.bernoulli_(1.0 - p)
    scale = 1.0 / (1.0 - p)

    def backward(grad):
        return grad * mask * scale, None

    return x * mask * scale, backward


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding with constant tables: backward gives cos and sin no gradient."""
    x1, x2 = x.chunk(2, dim=-1)
    out = x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def backward(grad):
        h1, h2 = (grad * sin).chunk(2, dim=-1)
        return grad * cos + torch.cat((h2, -h1), dim=-1), None, None

    return out, backward


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, gamma: float):
    """Binary focal loss with float (soft) targets, which get no gradient."""
    p = torch.sigmoid(logits)
    pt = p * targets + (1 - p) * (1 - targets)
    w = (1 - pt) ** gamma
    out = (-w * torch.log(pt)).mean()

    def backward(grad):
        dpt = gamma * (1 - pt) ** (gamma - 1) * torch.log(pt) - w / pt
        dz = dpt * (2 * targets - 1) * p * (1 - p)
        return grad * dz / logits.numel(), None, None

    return out, backward


def round_ste(x: torch.Tensor):
    """torch.round with a straight-through gradient clipped to |x| <= 1, undeclared."""
    inside = (x.abs() <= 1).to(x.dtype)

    def backward(grad):
        return grad * inside

    return torch.round(x), backward


def round_ste_declared(x: torch.Tensor):
    """round_ste, declared: its backward is meant to differ from round's derivative."""
    # s2sgrad: surrogate=true
    inside = (x.abs() <= 1).to(x.dtype)

    def backward(grad):
        return grad * inside

    return torch.round(x), backward


def spike(x: torch.Tensor):  # s2sgrad: surrogate=true
    """A step with a sigmoid surrogate gradient, whose own derivative is not 0."""
    s = torch.sigmoid(4 * x)

    def backward(grad):
        return grad * 4 * s * (1 - s)

    return (x > 0).to(x.dtype), backward


def sincos_surrogate(x: torch.Tensor):  # s2sgrad: surrogate=true
    """sin and cos, with a surrogate for cos's gradient; backward reads both outputs,
    whose derivative at the next order is then the one backward defines."""
    s, c = torch.sin(x), torch.cos(x)

    def backward(gs, gc):
        return gs * c - 2 * gc * s

    return s, c, backward


def relu_identity(x: torch.Tensor):
    """relu whose backward passes every gradient: wrong only where 0 is expected."""

    def backward(grad):
        return grad

    return torch.relu(x), backward


def squared_distance(x: torch.Tensor, y: torch.Tensor):
    """||x - y||^2 with y broadcast; backward returns y's gradient unreduced."""
    d = x - y

    def backward(grad):
        g = 2.0 * grad * d
        return g, -g

    return (d * d).sum(), backward


def relu_doubled(x: torch.Tensor):
    """relu whose backward doubles every gradient: wrong where 1 and where 0 is expected."""

    def backward(grad):
        return 2 * grad

    return torch.relu(x), backward


def square(x: torch.Tensor):
    def backward(grad):
        return 2 * grad * x

    return x * x, backward


def clip_gradient(x: torch.Tensor):
    """The identity whose backward clips the gradient: a surrogate not linear in its
    incoming gradient, so no forward mode agrees with it."""
    # s2sgrad: surrogate=true

    def backward(grad):
        return grad.clamp(-0.1, 0.1)

    return x * 1.0, backward


def relu_squared_root(x: torch.Tensor):
    """relu(x) ** 2, whose backward reads the output through `sqrt`: at a zero of the
    output its second derivative is 0 through forward, NaN through the saved output
    (an infinite gradient times 0)."""
    y = torch.relu(x) ** 2

    def backward(g):
        return 2 * g * y.sqrt()

    return y, backward


def safe_sqrt(x: torch.Tensor):
    """sqrt where x > 0, else 0: autograd through the `where` gives NaN for x <= 0
    (0 * inf through the branch not taken); this backward gives the true 0."""
    pos = x > 0
    y = torch.where(pos, torch.sqrt(x), torch.zeros_like(x))

    def backward(g):
        root = torch.sqrt(torch.where(pos, x, torch.ones_like(x)))
        return torch.where(pos, g * 0.5 / root, torch.zeros_like(g))

    return y, backward
