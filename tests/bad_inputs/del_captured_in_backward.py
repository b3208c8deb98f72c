# expect: S2S103 10:9
import torch


def exp(x: torch.Tensor):
    """exp(x)."""
    out = torch.exp(x)
    def backward(grad):
        g = grad * out
        del out
        return g
    return out, backward
