# expect: S2S117 9:24
import torch


def cube(x: torch.Tensor):
    """x ** 3."""
    sq = x * x
    def backward(grad):
        g = 3 * grad * sq
        sq = None
        return g
    return sq * x, backward
