# expect: S2S106 11:5
import torch


def sin_cos(x: torch.Tensor):
    """sin(x) and cos(x)."""
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(grad_s, grad_c):
        return grad_s * c - grad_c * s
    return s, c, backward
