# expect: S2S123 8:5
import torch


def sin_square_plus(x: torch.Tensor, b: torch.Tensor):
    h = x * x
    saved = [h]
    h += b
    def backward(grad):
        c = grad * torch.cos(saved[0])
        return c * 2 * x, c.sum_to_size(b.shape)
    return torch.sin(h), backward
