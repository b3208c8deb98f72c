# expect: S2S114 10:1
import torch


def scale_forward(x: torch.Tensor) -> torch.Tensor:
    """A plain helper whose name the generated module needs for `scale`."""
    return x * 2


def scale(x: torch.Tensor):
    """2 * x."""
    def backward(grad):
        return grad * 2
    return scale_forward(x), backward
