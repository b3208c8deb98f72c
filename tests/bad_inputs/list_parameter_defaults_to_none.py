# expect: S2S130 7:44
from typing import List

import torch


def with_none_default(y: torch.Tensor, xs: List[torch.Tensor] = None):
    out = y * 2
    if xs is not None:
        for x in xs:
            out = out + x
    def backward(g):
        return 2 * g, (None if xs is None else [g for _ in xs])
    return out, backward
