"""Neural-network building blocks through torch.nn.functional."""
import math

import torch
import torch.nn.functional as F


def gelu_scale(x: torch.Tensor, w: torch.Tensor, *, approximate: str = "none"):
    """gelu(x * w) * x with w (n,) broadcast; exact or tanh-approximated GELU."""
    h = F.gelu(x * w, approximate=approximate)
    def backward(grad):
        z = x * w
        if approximate == "tanh":
            k = math.sqrt(2.0 / math.pi)
            th = torch.tanh(k * (z + 0.044715 * z ** 3))
            slope = 0.5 * (1.0 + th) + 0.5 * z * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * z * z)
        else:
            cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
            slope = cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        gz = grad * x * slope
        return gz * w + grad * h, (gz * x).sum_to_size(w.shape), None
    return h * x, backward


def softplus_weighted(x: torch.Tensor, beta: float = 1.0):
    """softplus(x; beta) * x."""
    sp = F.softplus(x, beta=beta)
    def backward(grad):
        slope = torch.where(x * beta > 20.0, 1.0, torch.sigmoid(x * beta))
        return grad * (slope * x + sp), None
    return sp * x, backward


def relu_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor):
    """relu(x @ w1) @ w2; backward reads the hidden activation."""
    h = F.relu(x @ w1)
    def backward(grad):
        gh = torch.where(h > 0, grad @ w2.t(), 0.0)
        return gh @ w1.t(), x.t() @ gh, h.t() @ grad
    return h @ w2, backward


def layer_norm_affine(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-5):
    """Layer norm over the last dim with an affine map."""
    xc = x - x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.var(-1, keepdim=True, correction=0) + eps)
    xhat = xc * rstd
    def backward(grad):
        gx = grad * gamma
        dx = rstd * (gx - gx.mean(-1, keepdim=True) - xhat * (gx * xhat).mean(-1, keepdim=True))
        return dx, (grad * xhat).sum_to_size(gamma.shape), grad.sum_to_size(beta.shape), None
    return xhat * gamma + beta, backward


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """softmax(q k^T / sqrt(d)) v with F.softmax; backward reads the probabilities."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = F.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    def backward(grad):
        gp = grad @ v.transpose(-2, -1)
        gs = p * (gp - (gp * p).sum(-1, keepdim=True)) * scale
        return gs @ k, gs.transpose(-2, -1) @ q, p.transpose(-2, -1) @ grad
    return p @ v, backward


def nll_of_log_softmax(x: torch.Tensor, target: torch.Tensor):
    """-mean over rows of F.log_softmax(x)[target] as a one-hot contraction."""
    lp = F.log_softmax(x, dim=-1)
    def backward(grad):
        n = x.shape[0]
        return -grad * (target - torch.exp(lp) * target.sum(-1, keepdim=True)) / n, -grad * lp / n
    return -(lp * target).sum() / x.shape[0], backward
