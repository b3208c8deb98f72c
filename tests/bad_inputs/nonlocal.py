# expect: S2S102 10:9
import torch


def counted_exp(x: torch.Tensor):
    """exp(x), counting backward calls."""
    calls = 0
    out = torch.exp(x)
    def backward(grad):
        nonlocal calls
        calls += 1
        return grad * out
    return out, backward
