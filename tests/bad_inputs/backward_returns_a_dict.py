# expect: S2S108 10:9
import torch


def gate(x: torch.Tensor, w: torch.Tensor):
    """Converted once, then `grads[0]` was a KeyError at the first backward."""
    t = torch.tanh(x * w)
    def backward(g):
        d = g * (1 - t * t)
        return {"x": d * w, "w": d * x}
    return t, backward
