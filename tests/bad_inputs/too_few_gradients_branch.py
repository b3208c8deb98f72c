# expect: S2S108 10:9
import torch


def mul(x: torch.Tensor, y: torch.Tensor, exact: bool):
    """x * y."""
    def backward(grad):
        if exact:
            return grad * y, grad * x, None
        return grad * y, grad * x
    return x * y, backward
