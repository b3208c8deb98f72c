# expect: S2S105 10:9
import torch


def maybe_square(x: torch.Tensor, train: bool):
    """x ** 2."""
    def backward(grad):
        return 2 * grad * x, None
    if not train:
        backward = None
    return x * x, backward
