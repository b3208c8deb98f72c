# expect: S2S107 10:26
import torch


def sin_cos(x: torch.Tensor):
    """sin(x) and cos(x)."""
    s = torch.sin(x)
    c = torch.cos(x)
    out = (s, c)
    def backward(grad_s, grad_c):
        return grad_s * c - grad_c * s
    return out, backward
