# expect: S2S002 7:23
# -*- coding: latin-1 -*-
import torch


def mul(x, y):
    """x * y (produit élément par élément)."""
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
