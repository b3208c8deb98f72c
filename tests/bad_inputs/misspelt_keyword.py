# expect: S2S124 7:23
import torch


def rowsum(x: torch.Tensor, w: torch.Tensor):
    """A keyword no form of `sum` takes is reported at the keyword."""
    out = (x * w).sum(dimm=1)
    def backward(g):
        return g[:, None] * w, g[:, None] * x
    return out, backward
