# expect: S2S107 10:9
import torch


def moments(x: torch.Tensor):
    """Mean, second and third moment of x."""
    m1 = x.mean()
    m2 = (x * x).mean()
    m3 = (x * x * x).mean()
    def backward(g1, g2):
        n = x.numel()
        return (g1 + 2 * g2 * x) / n
    return (m1, m2, m3), backward
