# expect: S2S108 7:9
from typing import List
import torch
def total(xs: List[torch.Tensor]):
    y = torch.stack(xs).sum(0)
    def backward(g):
        return [g for _ in xs], None
    return y, backward
