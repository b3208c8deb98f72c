# expect: S2S113 7:1
import functools

import torch


@functools.lru_cache(maxsize=None)
def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
