# expect: S2S107 9:9
import torch


def sin_cos(x: torch.Tensor):
    """sin(x) and cos(x), with a backward that takes no gradient."""
    s = torch.sin(x)
    c = torch.cos(x)
    def backward():
        return None
    return (s, c), backward
