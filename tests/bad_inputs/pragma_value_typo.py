# expect: S2S122 6:5
import torch


def scaled_exp(x: torch.Tensor):
    # s2sgrad: policy=recompte
    t = torch.exp(x)
    def backward(grad):
        return grad * t
    return t * 2.0, backward
