# expect: S2S105 11:16
import torch


def tanh_with_hook(x: torch.Tensor):
    """tanh(x)."""
    out = torch.tanh(x)
    def backward(grad):
        return grad * (1 - out * out)
    def hook():
        return backward
    return out, backward
