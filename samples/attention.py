"""Single-head scaled dot-product attention with a hand-written backward."""
import math

import torch


def _causal_mask(n: int, m: int, device: torch.device) -> torch.Tensor:
    """Boolean (n, m) mask, True where query i may attend to key j (aligned to the end)."""
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n)


def _softmax_backward(p: torch.Tensor, grad_p: torch.Tensor) -> torch.Tensor:
    """Gradient of softmax over the last dim given its output p."""
    return p * (grad_p - (grad_p * p).sum(-1, keepdim=True))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """softmax(q @ k^T / sqrt(d)) @ v for q (..., Lq, d), k (..., Lk, d), v (..., Lk, dv)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    p = torch.softmax(scores, dim=-1)
    def backward(grad):
        grad_v = p.transpose(-2, -1) @ grad
        grad_s = _softmax_backward(p, grad @ v.transpose(-2, -1)) * scale
        grad_q = grad_s @ k
        grad_k = grad_s.transpose(-2, -1) @ q
        return grad_q, grad_k, grad_v
    return p @ v, backward


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Attention where query i only sees keys up to its own position."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    mask = _causal_mask(q.shape[-2], k.shape[-2], q.device)
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    def backward(grad):
        grad_v = p.transpose(-2, -1) @ grad
        grad_s = _softmax_backward(p, grad @ v.transpose(-2, -1)) * scale
        return grad_s @ k, grad_s.transpose(-2, -1) @ q, grad_v
    return p @ v, backward
