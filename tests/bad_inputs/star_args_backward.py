# expect: S2S110 7:18
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(*grads):
        return grads[0] * y, grads[0] * x
    return x * y, backward
