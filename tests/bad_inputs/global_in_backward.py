# expect: S2S102 11:9
import torch

GRAD_CALLS = 0


def traced_tanh(x: torch.Tensor):
    """tanh(x), counting backward calls in a module global."""
    out = torch.tanh(x)
    def backward(grad):
        global GRAD_CALLS
        GRAD_CALLS += 1
        return grad * (1 - out * out)
    return out, backward
