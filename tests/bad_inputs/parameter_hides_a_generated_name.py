# expect: S2S114 5:5
import torch


def erf_scaled(x: torch.Tensor, math: float = 2.0):
    t = torch.erf(x) * math
    def backward(g):
        return g * math * 2.0 / 3.141592653589793 ** 0.5 * torch.exp(-x * x) * t / t, None
    return t, backward
