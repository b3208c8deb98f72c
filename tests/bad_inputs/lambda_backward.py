# expect: S2S109 7:16
import torch


def negate(x: torch.Tensor):
    """-x."""
    return -x, lambda grad: -grad
