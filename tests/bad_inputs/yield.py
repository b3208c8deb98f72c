# expect: S2S104 8:9
import torch


def chunks_relu(x: torch.Tensor):
    """relu(x), one chunk at a time."""
    for chunk in x.chunk(2):
        yield chunk.clamp(min=0)
    def backward(grad):
        return grad * (x > 0)
    return x.clamp(min=0), backward
