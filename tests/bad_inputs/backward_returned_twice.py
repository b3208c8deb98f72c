# expect: S2S105 10:18
import torch


def square(x: torch.Tensor):
    """x ** 2."""
    out = x * x
    def backward(grad):
        return 2 * grad * x
    return (out, backward), backward
