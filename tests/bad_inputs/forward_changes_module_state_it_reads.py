# expect: S2S131 10:5
import torch

CALLS = []


def counted(x: torch.Tensor, w: torch.Tensor):
    """The scale grew with each call: backward's replay saw the next one's."""
    h = torch.tanh(x * w * len(CALLS))
    CALLS.append(1)
    def backward(g):
        d = g * 2.0 * (1 - h * h) * (len(CALLS) - 1)
        return d * w, d * x
    return h * 2.0, backward
