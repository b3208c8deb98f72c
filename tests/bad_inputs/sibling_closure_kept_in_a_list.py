# expect: S2S120 14:13
import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    u, inner_bwd = inner(a)
    kept = [inner_bwd]
    v = u * u
    def backward(grad):
        g_u = grad * 2.0 * u
        return kept[0](g_u)
    return v, backward
