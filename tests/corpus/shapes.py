"""Shape and layout: transpose, t, permute, reshape, view, flatten, (un)squeeze, expand,
broadcast_to, sum_to_size, tril, triu."""
import torch


def triangular_parts(a: torch.Tensor):
    """triu(a)^2 + tril(a, -1) * a for a square matrix a."""
    up = torch.triu(a)
    low = a.tril(-1)
    def backward(grad):
        return 2.0 * grad * (up + low)
    return up * up + low * a, backward


def transposed_product(x: torch.Tensor, y: torch.Tensor):
    """(x^T * y)^2 for x (m, n) and y (n, m), with torch.transpose."""
    xt = torch.transpose(x, 0, 1)
    p = xt * y
    def backward(grad):
        g = 2.0 * grad * p
        return (g * y).t(), g * xt
    return p * p, backward


def outer_energy(u: torch.Tensor, v: torch.Tensor):
    """sum_ij (u_i v_j)^2 through unsqueeze, expand and expand_as."""
    uu = u.unsqueeze(1).expand(-1, v.shape[0])
    vv = v.unsqueeze(0).expand_as(uu)
    p = uu * vv
    def backward(grad):
        return (2.0 * grad * p * vv).sum(1), (2.0 * grad * p * uu).sum(0)
    return (p * p).sum(), backward


def permuted_projection(x: torch.Tensor, w: torch.Tensor):
    """x (a, b, c) permuted to (c, a, b), flattened to (c, a*b), times w (a*b,)."""
    h = x.permute(2, 0, 1).reshape(x.shape[2], -1)
    def backward(grad):
        gh = grad.unsqueeze(1) * w
        gx = gh.reshape(x.shape[2], x.shape[0], x.shape[1]).permute(1, 2, 0)
        return gx, h.t() @ grad
    return h @ w, backward


def squeeze_flatten_view(x: torch.Tensor, w: torch.Tensor):
    """sigmoid(x) * w for x (n, 1, k, m), w (k, m), the long way round through
    squeeze, flatten, view and torch.t."""
    f = torch.flatten(x.squeeze(1), start_dim=1)
    s = torch.sigmoid(torch.t(f))
    sv = s.t().view(x.shape)
    def backward(grad):
        return grad * w * sv * (1.0 - sv), (grad * sv).sum_to_size(w.shape)
    return sv * w, backward


def column_energy(x: torch.Tensor, b: torch.Tensor):
    """s_j = sum_i x_ij b_j (kept as (1, n)) with broadcast_to and sum_to_size; the result s^2."""
    bb = torch.broadcast_to(b, x.shape)
    s = (x * bb).sum_to_size(1, x.shape[1])
    def backward(grad):
        gs = 2.0 * grad * s
        return gs * bb, (gs * x).sum(0)
    return s * s, backward
