"""Joining, splitting and indexing: slices, cat, stack, split, unbind, index_select,
index_add, gather, scatter_add, narrow, slice_scatter, tensor indices."""
import torch


def window_product(x: torch.Tensor):
    """x[:, 1:3] * x[:, :2] with constant slices; backward reads both windows."""
    a = x[:, 1:3]
    b = x[:, :2]
    def backward(grad):
        ga = torch.zeros_like(x).slice_scatter(grad * b, dim=1, start=1, end=3)
        gb = torch.zeros_like(x).slice_scatter(grad * a, dim=1, start=0, end=2)
        return ga + gb
    return a * b, backward


def concat_features(a: torch.Tensor, b: torch.Tensor):
    """sum_j h_ij^2 for h = cat([a, 2 b], dim=1)."""
    h = torch.cat([a, b * 2.0], dim=1)
    def backward(grad):
        gh = 2.0 * grad.unsqueeze(1) * h
        k = a.shape[1]
        return gh[:, :k], 2.0 * gh[:, k:]
    return (h * h).sum(1), backward


def stacked_powers(x: torch.Tensor, y: torch.Tensor):
    """sum over the stack of [x, y^2] of squares: x^2 + y^4."""
    s = torch.stack([x, y * y], dim=0)
    def backward(grad):
        g = 2.0 * grad * s
        return g[0], g[1] * 2.0 * y
    return (s * s).sum(0), backward


def split_gate(x: torch.Tensor):
    """GLU: a * sigmoid(b) for a, b = split(x, half, dim=-1)."""
    a, b = torch.split(x, x.shape[-1] // 2, dim=-1)
    g = torch.sigmoid(b)
    def backward(grad):
        return torch.cat([grad * g, grad * a * g * (1.0 - g)], dim=-1)
    return a * g, backward


def complex_magnitude(z: torch.Tensor):
    """sqrt(re^2 + im^2 + 1) for z (..., 2) unbound into re and im."""
    re, im = z.unbind(-1)
    m = torch.sqrt(re * re + im * im + 1.0)
    def backward(grad):
        return torch.stack([grad * re / m, grad * im / m], dim=-1)
    return m, backward


def select_rows(x: torch.Tensor, index: torch.Tensor, w: torch.Tensor):
    """rows^2 * w for rows = x[index] via index_select (index may repeat)."""
    rows = torch.index_select(x, 0, index)
    def backward(grad):
        g = 2.0 * grad * rows * w
        return torch.zeros_like(x).index_add(0, index, g), None, (grad * rows * rows).sum_to_size(w.shape)
    return rows * rows * w, backward


def gathered_log_likelihood(logits: torch.Tensor, index: torch.Tensor):
    """log p(index)^2 per row, with log_softmax and gather (index is (n, 1))."""
    lp = torch.log_softmax(logits, dim=1)
    picked = lp.gather(1, index)
    def backward(grad):
        g = torch.zeros_like(lp).scatter_add(1, index, 2.0 * grad * picked)
        return g - torch.exp(lp) * g.sum(1, keepdim=True), None
    return picked * picked, backward


def index_accumulate(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor, alpha: float = 1.0):
    """(x.index_add(0, index, src, alpha=alpha))^2."""
    acc = torch.index_add(x, 0, index, src, alpha=alpha)
    def backward(grad):
        g = 2.0 * grad * acc
        return g, None, g.index_select(0, index) * alpha, None
    return acc * acc, backward


def scatter_sine(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor):
    """sin(x.scatter_add(1, index, src))."""
    s = x.scatter_add(1, index, src)
    def backward(grad):
        g = grad * torch.cos(s)
        return g, None, g.gather(1, index)
    return torch.sin(s), backward


def narrow_window(x: torch.Tensor, start: int, length: int):
    """narrow(x, 1, start, length)^2."""
    w = torch.narrow(x, 1, start, length)
    def backward(grad):
        return torch.zeros_like(x).slice_scatter(2.0 * grad * w, 1, start, start + length), None, None
    return w * w, backward


def patch_columns(x: torch.Tensor, src: torch.Tensor):
    """(x with columns 1:3 replaced by src)^2, with torch.slice_scatter."""
    y = torch.slice_scatter(x, src, dim=1, start=1, end=3)
    def backward(grad):
        g = 2.0 * grad * y
        return g.slice_scatter(torch.zeros_like(src), dim=1, start=1, end=3), g[:, 1:3]
    return y * y, backward


def tensor_indexed_rows(x: torch.Tensor, index: torch.Tensor):
    """rows * rows[..., 0] (as a column) for rows = x[index] picked by an index tensor."""
    rows = x[index]
    first = rows[..., 0]
    def backward(grad):
        g_rows = grad * first.unsqueeze(-1)
        g_first = (grad * rows).sum(-1)
        g_rows = g_rows + torch.zeros_like(rows).slice_scatter(g_first.unsqueeze(-1), dim=-1, start=0, end=1)
        return torch.zeros_like(x).index_add(0, index, g_rows), None
    return rows * first.unsqueeze(-1), backward


def folded_blocks(x: torch.Tensor):
    """Column blocks of x (m, 2k) stacked as rows: h = cat(split(x, k, dim=1), dim=0); h^2."""
    h = torch.cat(torch.split(x, x.shape[1] // 2, dim=1), dim=0)
    def backward(grad):
        g = 2.0 * grad * h
        m = x.shape[0]
        return torch.cat([g[:m], g[m:]], dim=1)
    return h * h, backward


def moved_axis(x: torch.Tensor, w: torch.Tensor):
    """s = stack(unbind(x, 1), 0), i.e. x^T; the result (s * w)^2 with w (m,) broadcast."""
    s = torch.stack(x.unbind(1), dim=0)
    def backward(grad):
        g = 2.0 * grad * s * w
        return (g * w).t(), (g * s).sum_to_size(w.shape)
    return (s * w) * (s * w), backward


def first_chunk(x: torch.Tensor):
    """a^2 for the first piece a = split(x, k, dim=1)[0]."""
    a = torch.split(x, x.shape[1] // 2, dim=1)[0]
    def backward(grad):
        return torch.cat([2.0 * grad * a, torch.zeros_like(a)], dim=1)
    return a * a, backward
