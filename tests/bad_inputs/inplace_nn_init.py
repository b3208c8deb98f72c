# expect: S2S103 8:5
import torch
from torch import nn


def linear(x: torch.Tensor, w: torch.Tensor):
    """x @ w.T with w re-initialised."""
    nn.init.zeros_(w)
    def backward(grad):
        return grad @ w, grad.T @ x
    return x @ w.T, backward
