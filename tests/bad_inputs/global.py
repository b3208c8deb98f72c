# expect: S2S102 9:5
import torch

LAST_INPUT = None


def remember_sin(x: torch.Tensor):
    """sin(x), remembering the last input."""
    global LAST_INPUT
    LAST_INPUT = x
    def backward(grad):
        return grad * torch.cos(x)
    return torch.sin(x), backward
