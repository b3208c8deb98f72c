# expect: S2S126 7:12
import torch


def scaled(x: torch.Tensor, w: torch.Tensor):
    t = x * w
    keep = t.requires_grad
    def backward(grad):
        return (grad * w, grad * x) if keep else (None, None)
    return t, backward
