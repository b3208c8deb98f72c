# expect: S2S003 7:9
import torch


class Ops:
    @staticmethod
    def square(x: torch.Tensor):
        def backward(g):
            return 2 * g * x
        return x * x, backward
