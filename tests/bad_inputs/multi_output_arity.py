# expect: S2S107 13:17
import torch


def moments(x: torch.Tensor):
    """Mean of x, with its count and rank: numbers, which take no gradient."""
    m1 = x.mean()
    n = x.numel()
    d = x.dim()
    def backward(g1, g2):
        grad = (g1 + 2 * g2 * x) / n
        return grad
    return (m1, n, d), backward
