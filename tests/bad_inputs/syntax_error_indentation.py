# expect: S2S001 8:7
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    out = x * y
      def backward(grad):
        return grad * y, grad * x
    return out, backward
