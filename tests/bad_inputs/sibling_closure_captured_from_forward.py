# expect: S2S120 17:16
import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    u, inner_bwd = inner(a)
    v = u * u
    def backward(grad):
        g_u = grad * 2.0 * u
        return inner_bwd(g_u)
    return v, backward
