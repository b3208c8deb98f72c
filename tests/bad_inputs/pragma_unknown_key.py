# expect: S2S122 5:35
import torch


def scaled_exp(x: torch.Tensor):  # s2sgrad: polcy=recompute
    t = torch.exp(x)
    def backward(grad):
        return grad * t
    return t * 2.0, backward
