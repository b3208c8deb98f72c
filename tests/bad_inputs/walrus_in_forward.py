# expect: S2S129 6:12
import torch


def doubled_exp(x: torch.Tensor):
    out = (e := x.exp()) * 2.0
    def backward(grad):
        return grad * 2.0 * e
    return out, backward
