# expect: S2S105 10:17
import torch


def power(x: torch.Tensor, n: int):
    """x ** n."""
    def backward(grad):
        if n == 0:
            return torch.zeros_like(x), None
        inner = backward(grad)[0]
        return n * grad * x ** (n - 1) + 0 * inner, None
    return x**n, backward
