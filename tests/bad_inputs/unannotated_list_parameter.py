# expect: S2S125 6:9
import torch


def weighted_sum(xs, w):
    y = torch.stack(xs).sum(0) * w
    def backward(grad):
        return [grad * w for _ in xs], grad * torch.stack(xs).sum(0)
    return y, backward
