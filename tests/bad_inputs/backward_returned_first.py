# expect: S2S106 10:12
import torch


def square(x: torch.Tensor):
    """x ** 2."""
    out = x * x
    def backward(grad):
        return 2 * grad * x
    return backward, out
