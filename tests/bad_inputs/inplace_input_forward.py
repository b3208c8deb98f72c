# expect: S2S103 7:5
import torch


def doubled_exp(x: torch.Tensor):
    """exp(2 * x)."""
    x.mul_(2)
    out = torch.exp(x)
    def backward(grad):
        return 2 * grad * out
    return out, backward
