# expect: S2S127 14:15
import torch


def sin_cos(x: torch.Tensor):
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(gs, gc):
        return gs * c - gc * s
    return s, c, backward


def sin_times_cos(x: torch.Tensor):
    s, c, _ = sin_cos(x)
    def backward(g):
        return sin_cos(x)[2](g * c, g * s)
    return s * c, backward
