# expect: S2S103 8:5
from typing import List

import torch


def appends_to_param(xs: List[torch.Tensor], y: torch.Tensor):
    xs.append(y)
    out = torch.stack(xs).sum(0)
    def backward(g):
        return [g for _ in xs[:-1]], g
    return out, backward
