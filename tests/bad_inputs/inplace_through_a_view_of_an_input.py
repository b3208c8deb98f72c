# expect: S2S103 6:5
import torch


def scaled(x: torch.Tensor):
    x.diagonal().mul_(2.0)
    def backward(grad):
        return grad
    return x * 1.0, backward
