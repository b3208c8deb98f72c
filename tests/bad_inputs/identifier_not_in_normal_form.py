# expect: S2S132 8:5
import torch


def f(x: torch.Tensor, w: torch.Tensor):
    """Python rebinds `s` on the next line; s2sgrad saw a new name."""
    s = torch.sigmoid(x)
    ｓ = s * w
    def backward(g):
        sg = torch.sigmoid(x)
        return g * (s * (1 - sg) * x + s), g * sg * x
    return s * x, backward
