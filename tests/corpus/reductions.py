"""Reductions and normalizers: sum, mean, amax, softmax, log_softmax."""
import torch


def log1p_sum_squares(x: torch.Tensor):
    """log1p(sum_j x_ij^2) per row; backward reads the sums s."""
    s = (x * x).sum(dim=1)
    def backward(grad):
        return (grad / (1.0 + s)).unsqueeze(1) * 2.0 * x
    return torch.log1p(s), backward


def mean_center_square(x: torch.Tensor, dim: int = 0):
    """(x - mean(x, dim))^2; backward reads the centered values."""
    mu = x.mean(dim=dim, keepdim=True)
    xc = x - mu
    def backward(grad):
        g = 2.0 * grad * xc
        return g - g.mean(dim=dim, keepdim=True), None
    return xc * xc, backward


def logsumexp_lastdim(x: torch.Tensor):
    """Stable logsumexp over the last dim; backward reads the shifted exponentials and sums."""
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    def backward(grad):
        return grad.unsqueeze(-1) * e / s
    return (m + torch.log(s)).squeeze(-1), backward


def cross_entropy(logits: torch.Tensor, target: torch.Tensor):
    """-sum_j target_j * log_softmax(logits)_j per row, soft targets (differentiable)."""
    lp = torch.log_softmax(logits, dim=-1)
    def backward(grad):
        g = grad.unsqueeze(-1)
        return g * (torch.exp(lp) * target.sum(-1, keepdim=True) - target), -g * lp
    return -(target * lp).sum(-1), backward


def softmax_expectation(x: torch.Tensor, v: torch.Tensor, tau: float = 2.0):
    """sum_j softmax(x / tau)_j * v_j per row."""
    p = torch.softmax(x / tau, dim=-1)
    def backward(grad):
        g = grad.unsqueeze(-1)
        ev = (p * v).sum(-1, keepdim=True)
        return g * p * (v - ev) / tau, g * p, None
    return (p * v).sum(-1), backward
