# expect: S2S103 10:5
import torch


def double_then_clamp(x: torch.Tensor):
    """2 * x, clamped below at zero."""
    t = x * 2
    def backward(grad):
        return grad * 2 * (t > 0)
    t.clamp_(min=0)
    return t, backward
