# expect: S2S120 14:13
import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    u = inner(a)[0]
    slope = inner(a)[1](torch.ones_like(a))
    def backward(grad):
        return grad * slope
    return u, backward
