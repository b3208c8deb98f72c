# expect: S2S109 7:16
import torch


def negate(x: torch.Tensor):
    """-x."""
    backward = lambda grad: -grad
    return -x, backward
