# expect: S2S125 6:5
import torch


def pair_sum(pair, w):
    a, b = pair
    y = (a + b) * w
    def backward(grad):
        return (grad * w, grad * w), grad * (a + b)
    return y, backward
