# expect: S2S002 6:18
import torch


def mul(x, y):
    """x * y (café)."""
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
