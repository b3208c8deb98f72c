# expect: S2S123 9:9
import torch


def acts_sum(x: torch.Tensor, b: torch.Tensor):
    h = x * 1.0
    acts = []
    for _ in range(3):
        h += b
        acts.append(h)
    def backward(g):
        return g * 6, (g * 6).sum_to_size(b.shape)
    return sum(acts), backward
