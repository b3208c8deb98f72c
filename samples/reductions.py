"""Reductions over a dimension whose backward broadcasts the gradient back."""
import torch


def sum_dim(x: torch.Tensor, dim: int, keepdim: bool = False):
    """Sum over dim; backward only needs x's shape."""
    def backward(grad):
        if not keepdim:
            grad = grad.unsqueeze(dim)
        return grad.expand(x.shape), None, None
    return x.sum(dim, keepdim=keepdim), backward


def mean_dim(x: torch.Tensor, dim: int, keepdim: bool = False):
    """Mean over dim; backward reads x's shape and the reduced size n."""
    n = x.shape[dim]
    def backward(grad):
        if not keepdim:
            grad = grad.unsqueeze(dim)
        return grad.expand(x.shape) / n, None, None
    return x.mean(dim, keepdim=keepdim), backward


def sum_all(x: torch.Tensor):
    """Sum of all elements to a scalar."""
    def backward(grad):
        return grad.expand(x.shape)
    return x.sum(), backward
