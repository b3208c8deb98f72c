# expect: S2S103 10:26
import torch
import torch.nn.functional as F


def relu_mul(x: torch.Tensor, w: torch.Tensor):
    """relu(x * w)."""
    t = x * w
    def backward(grad):
        mask = F.relu(t, inplace=True) > 0
        return grad * mask * w, grad * mask * x
    return F.relu(t), backward
