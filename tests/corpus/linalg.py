"""Matrix products: the @ operator (1-D and 2-D operands), torch.mm and torch.bmm."""
import torch


def linear_tanh_rowsum(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    """sum_j tanh(x @ w + b)_ij: a dense layer reduced over its outputs."""
    a = torch.tanh(x @ w + b)
    def backward(grad):
        gh = grad.unsqueeze(-1) * (1.0 - a * a)
        return gh @ w.t(), x.t() @ gh, gh.sum(0)
    return a.sum(-1), backward


def quadratic_form(x: torch.Tensor, A: torch.Tensor):
    """x^T A x for a vector x: matmul with a 1-D operand on either side."""
    ax = torch.matmul(A, x)
    def backward(grad):
        return grad * (ax + A.t() @ x), grad * (x.unsqueeze(1) * x.unsqueeze(0))
    return x @ ax, backward


def projected_energy(x: torch.Tensor, w: torch.Tensor):
    """0.5 * ||x @ w||^2 per row, with torch.mm."""
    h = torch.mm(x, w)
    def backward(grad):
        gh = grad.unsqueeze(-1) * h
        return torch.mm(gh, w.t()), torch.mm(x.t(), gh)
    return 0.5 * (h * h).sum(-1), backward


def batched_bilinear(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """(a @ b) * c for batches of matrices, with torch.bmm."""
    p = torch.bmm(a, b)
    def backward(grad):
        gp = grad * c
        return torch.bmm(gp, b.transpose(1, 2)), torch.bmm(a.transpose(1, 2), gp), grad * p
    return p * c, backward
