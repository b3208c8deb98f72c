# expect: S2S120 18:16
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
        g_u = grad * 2.0 * u
        _, bwd = inner(a)
        return bwd(g_u)
    return v, backward
