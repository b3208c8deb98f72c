# expect: S2S103 8:9
import torch


def mul(x, y):
    """x * y."""
    def backward(grad):
        y.mul_(grad)
        return grad * y, grad * x
    return x * y, backward
