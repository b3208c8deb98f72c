# expect: S2S110 5:29
import torch


def scaled(x: torch.Tensor, **options):
    """x * options["scale"]."""
    k = options.get("scale", 1.0)
    def backward(grad):
        return grad * k
    return x * k, backward
