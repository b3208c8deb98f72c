# expect: S2S121 10:9
import torch


def _noise(x):
    return x + 0.1 * torch.randn_like(x)


def noisy_tanh(x: torch.Tensor, w: torch.Tensor):
    h = _noise(x)
    t = torch.tanh(h)
    def backward(grad):
        return grad * w * (1 - t * t), (grad * t).sum_to_size(w.shape)
    return t * w, backward
