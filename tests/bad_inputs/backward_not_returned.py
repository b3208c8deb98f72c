# expect: S2S106 9:5
import torch


def cube(x: torch.Tensor):
    """x ** 3."""
    def backward(grad):
        return 3 * grad * x * x
    return x * x * x
