# expect: S2S123 7:5
import torch


def double_first_row(x: torch.Tensor):
    t = x * 1.0
    t[0].mul_(2.0)
    def backward(g):
        m = torch.ones_like(g)
        m[0] = 2.0
        return g * m
    return t, backward
