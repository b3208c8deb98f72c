# expect: S2S120 16:16
import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    pair = inner(a)
    u = pair[0]
    def backward(grad):
        return pair[1](2.0 * grad * u)
    return u * u, backward
