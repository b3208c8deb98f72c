# expect: S2S103 11:5
import torch


def softplus(x: torch.Tensor):
    """log(1 + exp(x))."""
    e = torch.exp(x)
    def backward(grad):
        return grad * e / (1 + e)
    out = torch.log1p(e)
    del e
    return out, backward
