# expect: S2S130 7:21
from typing import Dict

import torch


def scaled(weights: Dict[str, torch.Tensor], x: torch.Tensor):
    out = weights["w"] * x
    def backward(grad):
        return {"w": grad * x}, grad * weights["w"]
    return out, backward
