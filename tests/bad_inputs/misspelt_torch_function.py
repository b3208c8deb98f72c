# expect: S2S124 7:9
import torch


def gate(x: torch.Tensor, w: torch.Tensor):
    """Was S2S124 at the return, with a hint to annotate `out`: the typo stayed hidden."""
    h = torch.tahn(x * w)
    out = h * 2.0
    def backward(g):
        return g * 2.0 * (1 - h * h) * w, g * 2.0 * (1 - h * h) * x
    return out, backward
