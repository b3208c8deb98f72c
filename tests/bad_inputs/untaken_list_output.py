# expect: S2S107 12:25
import torch


def sorted_halves(x: torch.Tensor):
    """x sorted along its rows, the sort indices, and the sorted rows in two halves."""
    values, idx = torch.sort(x, dim=-1)
    halves = torch.chunk(values, 2, dim=0)
    def backward(grad_values, grad_halves):
        grad = grad_values + torch.cat(grad_halves, dim=0)
        return torch.zeros_like(x).scatter(-1, idx, grad)
    return values, idx, halves, backward
