# expect: S2S112 10:32
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x · y (élément par élément)."""
    def backward(grad):
        return grad * y, grad * x
    ε = 1e-6
    return (x + ε) * (y + ε) * α, backward
