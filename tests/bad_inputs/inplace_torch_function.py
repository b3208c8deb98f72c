# expect: S2S103 9:9
import torch


def logistic(x: torch.Tensor):
    """sigmoid(x)."""
    s = torch.sigmoid(x)
    def backward(grad):
        torch.sigmoid_(s)
        return grad * s * (1 - s)
    return s, backward
