# expect: S2S104 8:9
import torch


def lazy_mul(x: torch.Tensor, y: torch.Tensor):
    """x * y, gradients produced lazily."""
    def backward(grad):
        yield grad * y, grad * x
    return x * y, backward
