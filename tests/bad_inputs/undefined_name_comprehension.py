# expect: S2S112 9:30
import torch


def stack_scaled(x: torch.Tensor, n: int):
    """Stack x * i for i < n."""
    out = torch.stack([x * i for i in range(n)])
    def backward(grad):
        return sum(grad[i] * j for i in range(n)), None
    return out, backward
