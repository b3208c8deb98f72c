# expect: S2S121 9:13
import torch
import torch.nn.functional as F


def noisy_square(x: torch.Tensor, steps: int = 2):
    h = x
    for _ in range(steps):
        h = F.dropout(h * h, 0.5)
    def backward(grad):
        return grad * 2.0 * h, None
    return h.sum(), backward
