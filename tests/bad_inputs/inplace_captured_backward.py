# expect: S2S103 9:9
import torch


def shifted_square(x: torch.Tensor):
    """(x + 1) ** 2."""
    t = x + 1
    def backward(grad):
        t.add_(1)
        return 2 * grad * t
    return t * t, backward
