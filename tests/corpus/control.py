"""Control flow and signatures: if/else on options, keyword-only and non-tensor parameters,
late binding, several outputs, module-level helpers."""
import torch

DEFAULT_SCALE = 1.5


def _tanh_slope(t):
    """Derivative of tanh given its value."""
    return 1.0 - t * t


def activation_square(x: torch.Tensor, kind: str = "tanh"):
    """a^2 for a = tanh(x) or sigmoid(x), chosen by a string option."""
    if kind == "tanh":
        a = torch.tanh(x)
        d = 1.0 - a * a
    else:
        a = torch.sigmoid(x)
        d = a * (1.0 - a)
    def backward(grad):
        return grad * 2.0 * a * d, None
    return a * a, backward


def scaled_residual(x: torch.Tensor, w: torch.Tensor, *, scale: float = DEFAULT_SCALE, residual: bool = True):
    """scale * tanh(x * w) (+ x); keyword-only options, w (n,) broadcast."""
    t = torch.tanh(x * w)
    if residual:
        out = scale * t + x
    else:
        out = scale * t
    def backward(grad):
        gz = grad * scale * _tanh_slope(t)
        gx = gz * w + grad if residual else gz * w
        return gx, (gz * x).sum_to_size(w.shape), None, None
    return out, backward


def rebinding(x: torch.Tensor, y: torch.Tensor):
    """sin(x * y + 1) * x: t is rebound, backward reads its last binding (late binding)."""
    t = x * y
    u = t + 1.0
    t = torch.sin(u)
    def backward(grad):
        c = torch.cos(u)
        return grad * (c * y * x + t), grad * c * x * x
    return t * x, backward


def rotate(x: torch.Tensor, theta: torch.Tensor):
    """(x cos(theta), x sin(theta)) with theta (n,) broadcast: two outputs."""
    c = torch.cos(theta)
    s = torch.sin(theta)
    def backward(grad_u, grad_v):
        gx = grad_u * c + grad_v * s
        gtheta = (grad_v * x * c - grad_u * x * s).sum_to_size(theta.shape)
        return gx, gtheta
    return (x * c, x * s), backward


def two_heads(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    """(x @ w1, 2 tanh(x @ w2)): two outputs, one gradient each."""
    a = x @ w1
    h = torch.tanh(x @ w2)
    def backward(grad_a, grad_h):
        gz = 2.0 * grad_h * (1.0 - h * h)
        return grad_a @ w1.t() + gz @ w2.t(), x.t() @ grad_a, x.t() @ gz
    return (a, 2.0 * h), backward


def moments(x: torch.Tensor, dim: int = -1):
    """(mean, mean of squares) along dim, both keepdim; backward reads n only."""
    n = x.shape[dim]
    m1 = x.mean(dim, keepdim=True)
    m2 = (x * x).mean(dim, keepdim=True)
    def backward(grad_m1, grad_m2):
        return (grad_m1 + 2.0 * grad_m2 * x) / n, None
    return (m1, m2), backward


def polynomial(x: torch.Tensor, coeffs: list, shift=None):
    """p(z)^2 for p(z) = c0 + c1 z + c2 z^2, z = x - shift (or x when shift is None)."""
    if shift is None:
        z = x
    else:
        z = x - shift
    p = coeffs[0] + coeffs[1] * z + coeffs[2] * z * z
    def backward(grad):
        return 2.0 * grad * p * (coeffs[1] + 2.0 * coeffs[2] * z), None, None
    return p * p, backward
