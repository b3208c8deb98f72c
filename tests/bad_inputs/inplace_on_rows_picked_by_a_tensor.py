# expect: S2S123 8:5
import torch


def double_some_rows(x: torch.Tensor, rows: torch.Tensor):
    """`t[rows]` with a tensor index is a copy: mul_ changes the copy, not t."""
    t = x * 1.0
    t[rows].mul_(2.0)
    def backward(g):
        m = torch.ones_like(g)
        m[rows] = 2.0
        return g * m, None
    return t, backward
