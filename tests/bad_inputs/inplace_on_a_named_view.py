# expect: S2S123 8:5
import torch


def doubled(x: torch.Tensor):
    t = x * 1.0
    v = t.view(-1)
    v.mul_(2.0)
    def backward(g):
        return g * 2.0
    return t, backward
