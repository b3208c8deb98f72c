# expect: S2S114 5:5
import torch


def cast(x: torch.Tensor):
    """Converted once; the op `cast` replaced `typing.cast`, which every op calls."""
    s = torch.sigmoid(x)
    def backward(g):
        return g * s * (1 - s)
    return s, backward
