# expect: S2S111 10:5
import torch


def relu(x: torch.Tensor):
    """max(x, 0)."""
    mask = x > 0
    def backward(grad):
        return grad * mask
    def backward(grad):
        return torch.where(mask, grad, torch.zeros_like(grad))
    return x * mask, backward
