# expect: S2S121 7:9
import torch
import torch.nn.functional as F


def gumbel_scaled(logits: torch.Tensor, w: torch.Tensor, tau: float = 1.0):
    y = F.gumbel_softmax(logits, tau=tau)
    def backward(grad):
        gy = grad * w
        return (gy - (gy * y).sum(-1, keepdim=True)) * y / tau, (grad * y).sum_to_size(w.shape), None
    return y * w, backward
