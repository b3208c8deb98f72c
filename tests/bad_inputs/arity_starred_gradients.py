# expect: S2S108 10:9
import torch


def scaled_pair(x: torch.Tensor, y: torch.Tensor, scale: float):
    out = (x + y) * scale
    def backward(grad):
        g = grad * scale
        grads = (g, g)
        return *grads, None
    return out, backward
