# expect: S2S105 12:23
import torch

REGISTRY = {}


def registered_exp(x: torch.Tensor):
    """exp(x), keeping backward in a registry."""
    out = torch.exp(x)
    def backward(grad):
        return grad * out
    REGISTRY["exp"] = backward
    return out, backward
