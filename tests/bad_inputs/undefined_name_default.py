# expect: S2S112 5:43
import torch


def leaky(x: torch.Tensor, slope: float = DEFAULT_SLOPE):
    """Leaky relu."""
    mask = x > 0
    def backward(grad):
        return torch.where(mask, grad, grad * slope), None
    return torch.where(mask, x, x * slope), backward
