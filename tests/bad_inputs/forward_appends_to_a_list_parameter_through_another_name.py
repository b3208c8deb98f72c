# expect: S2S103 9:5
from typing import List

import torch


def appends_through_alias(xs: List[torch.Tensor], y: torch.Tensor):
    ys = xs
    ys.append(y)
    out = torch.stack(ys).sum(0)
    def backward(g):
        return [g for _ in xs[:-1]], g
    return out, backward
