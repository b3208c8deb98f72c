# expect: S2S123 7:5
import torch


def half_diagonal(x: torch.Tensor):
    t = x * x
    t.diagonal().mul_(0.5)
    out = t * x
    def backward(g):
        m = torch.ones_like(g)
        m.diagonal().fill_(0.5)
        return g * t + g * x * 2 * x * m
    return out, backward
