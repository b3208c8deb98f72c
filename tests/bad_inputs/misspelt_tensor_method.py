# expect: S2S124 7:9
import torch


def gate(x: torch.Tensor, w: torch.Tensor):
    """A tensor's method spelled wrong is reported where it is called."""
    h = (x * w).sigmod()
    out = h * 2.0
    def backward(g):
        d = g * 2.0 * h * (1 - h)
        return d * w, d * x
    return out, backward
