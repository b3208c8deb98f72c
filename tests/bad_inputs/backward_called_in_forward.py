# expect: S2S105 9:13
import torch


def checked_square(x: torch.Tensor):
    """x ** 2, with a self-test of backward."""
    def backward(grad):
        return 2 * grad * x
    probe = backward(torch.ones_like(x))
    assert probe.shape == x.shape
    return x * x, backward
