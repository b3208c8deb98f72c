# expect: S2S103 9:9
import torch


def traced_stack(x: torch.Tensor, y: torch.Tensor):
    """Stack x and y, recording each backward call."""
    calls = []
    def backward(grad):
        calls.append(grad.shape)
        return grad[0], grad[1]
    return torch.stack([x, y]), backward
