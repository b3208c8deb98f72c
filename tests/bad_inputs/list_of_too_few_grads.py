# expect: S2S108 8:9
import torch


def mul(a: torch.Tensor, b: torch.Tensor):
    """a * b, whose backward lists one gradient for two parameters."""
    def backward(grad):
        return [grad * b]
    return a * b, backward
