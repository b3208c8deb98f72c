# expect: S2S001 7:5
import torch


def locked_mul(x: torch.Tensor, y: torch.Tensor, lock):
    """x * y under a lock."""
    async with lock:
        out = x * y
    def backward(grad):
        return grad * y, grad * x, None
    return out, backward
