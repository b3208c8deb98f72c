# expect: S2S129 6:5
import torch


def cos_or_sin(x: torch.Tensor, mode: int):
    match mode:
        case 0:
            c = x.cos()
        case _:
            c = -x.sin()
    def backward(g):
        return g * c, None
    return x.sin() * 1.0, backward
