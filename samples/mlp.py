"""Two-layer MLP blocks with hand-written backward passes."""
import torch


def mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor):
    """tanh(x @ w1 + b1) @ w2 + b2 for x (N, d_in), w1 (d_in, d_h), w2 (d_h, d_out)."""
    a = torch.tanh(x @ w1 + b1)
    def backward(grad):
        grad_a = grad @ w2.t()
        grad_h = grad_a * (1 - a * a)
        return (grad_h @ w1.t(), x.t() @ grad_h, grad_h.sum(0),
                a.t() @ grad, grad.sum(0))
    return a @ w2 + b2, backward


def relu_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor):
    """relu(x @ w1 + b1) @ w2 + b2, with the ReLU written as a mask."""
    h = x @ w1 + b1
    mask = h > 0
    a = h * mask
    def backward(grad):
        grad_h = (grad @ w2.t()) * mask
        return (grad_h @ w1.t(), x.t() @ grad_h, grad_h.sum(0),
                a.t() @ grad, grad.sum(0))
    return a @ w2 + b2, backward
