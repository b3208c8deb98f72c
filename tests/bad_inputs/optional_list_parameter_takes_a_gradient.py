# expect: S2S130 7:15
from typing import List, Optional

import torch


def total(xs: Optional[List[torch.Tensor]], y: torch.Tensor):
    out = y if xs is None else y + torch.stack(xs).sum(0)
    def backward(grad):
        return (None if xs is None else [grad for _ in xs]), grad
    return out, backward
