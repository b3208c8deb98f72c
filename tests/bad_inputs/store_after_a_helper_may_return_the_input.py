# expect: S2S123 12:5
import torch


def helper(v):
    return v


def f(x: torch.Tensor):
    t = x * 2
    t = helper(x)
    t[0] = 0.0
    def backward(g):
        return g
    return t, backward
