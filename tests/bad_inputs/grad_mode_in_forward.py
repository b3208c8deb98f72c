# expect: S2S126 6:13
import torch


def doubled(x: torch.Tensor):
    track = torch.is_grad_enabled()
    y = x * 2
    def backward(grad):
        return grad * 2 if track else None
    return y, backward
