# expect: S2S123 7:5
import torch


def sin_doubled(x: torch.Tensor):
    h = x.view(-1)
    h *= 2.0
    def backward(grad):
        return grad * torch.cos(x) * 2.0
    return torch.sin(x), backward
