# expect: S2S101 9:5
import torch


def square(x: torch.Tensor):
    """x ** 2."""
    def backward(grad):
        return 2 * grad * x
    return x * x, backward
    print("unreachable")
