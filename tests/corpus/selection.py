"""Selection and masks: where, maximum/minimum, masked_fill, comparisons and boolean logic."""
import torch


def leaky_where(x: torch.Tensor, slope: float = 0.1):
    """y = x where x > 0 else slope * x; the result y^2 (backward reads y and the mask)."""
    pos = x > 0
    y = torch.where(pos, x, slope * x)
    def backward(grad):
        g = 2.0 * grad * y
        return torch.where(pos, g, slope * g), None
    return y * y, backward


def blend(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor):
    """(x where m else y)^3, with the method spelling x.where(m, y); m is a bool mask."""
    b = x.where(m, y)
    def backward(grad):
        g = 3.0 * grad * b * b
        return torch.where(m, g, 0.0), torch.where(m, 0.0, g), None
    return b ** 3, backward


def max_min_energy(x: torch.Tensor, y: torch.Tensor):
    """max(x, y)^2 + min(x, y)^2 with y (n,) broadcast against x (m, n)."""
    hi = torch.maximum(x, y)
    lo = torch.minimum(x, y)
    def backward(grad):
        x_wins = x > y
        gx = torch.where(x_wins, 2.0 * grad * hi, 2.0 * grad * lo)
        gy = torch.where(x_wins, 2.0 * grad * lo, 2.0 * grad * hi)
        return gx, gy.sum_to_size(y.shape)
    return hi * hi + lo * lo, backward


def masked_attention(s: torch.Tensor, v: torch.Tensor, m: torch.Tensor):
    """softmax(s masked to -inf where m) @ v; m never masks a whole row."""
    p = torch.softmax(s.masked_fill(m, float("-inf")), dim=-1)
    def backward(grad):
        gp = grad @ v.transpose(-2, -1)
        gs = p * (gp - (gp * p).sum(-1, keepdim=True))
        return gs, p.transpose(-2, -1) @ grad, None
    return p @ v, backward


def sign_agreement(x: torch.Tensor, y: torch.Tensor):
    """t = x * y where x and y have the same sign, else (x - y)^2 / 2; the result t^2."""
    agree = ~((x <= 0) ^ (y <= 0))
    t = torch.where(agree, x * y, 0.5 * (x - y) ** 2)
    def backward(grad):
        g = 2.0 * grad * t
        d = x - y
        return torch.where(agree, g * y, g * d), torch.where(agree, g * x, -g * d)
    return t * t, backward


def band_mask(x: torch.Tensor, y: torch.Tensor, lo: float = -0.5, hi: float = 0.5):
    """t = x * y inside the band lo < x < hi or where y >= 0, else x; the result t^2."""
    keep = ((x > lo) & (x < hi)) | (y >= 0)
    t = torch.where(keep, x * y, x)
    def backward(grad):
        g = 2.0 * grad * t
        return torch.where(keep, g * y, g), torch.where(keep, g * x, 0.0), None, None
    return t * t, backward


def pick_row_max(x: torch.Tensor, y: torch.Tensor):
    """t = x * y at each row's maximum of x where y != 0, else 0; the result t^2."""
    chosen = (x == x.amax(dim=-1, keepdim=True)) & (y != 0.0)
    t = torch.where(chosen, x * y, 0.0)
    def backward(grad):
        g = 2.0 * grad * t
        return g * y, g * x
    return t * t, backward
