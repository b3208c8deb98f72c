# expect: S2S106 9:5
import torch


def square(x: torch.Tensor):
    """x ** 2, computed by the caller."""
    def backward(grad):
        return 2 * grad * x
    return backward
