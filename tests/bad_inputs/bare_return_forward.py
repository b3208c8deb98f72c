# expect: S2S101 9:9
import torch


def log_checked(x: torch.Tensor):
    """log(x) for positive x."""
    if (x <= 0).any():
        print("non-positive input")
        return
    def backward(grad):
        return grad / x
    return torch.log(x), backward
