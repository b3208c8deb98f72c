# expect: S2S001 5:26
import torch


def mul(x: torch.Tensor, x: torch.Tensor):
    """x * x."""
    def backward(grad):
        return 2 * grad * x, None
    return x * x, backward
