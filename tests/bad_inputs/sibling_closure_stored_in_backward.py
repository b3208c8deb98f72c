# expect: S2S120 16:26
import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    u = inner(a)[0]
    v = u * u
    def backward(grad):
        inner_backward = inner(a)[1]
        return inner_backward(grad * 2.0 * u)
    return v, backward
