# expect: S2S133 14:9
import torch


def g(x: torch.Tensor):
    t = torch.exp(x)
    def backward(grad):
        return grad * t
    return t, backward


if torch.__version__ >= "2":
    # beside g, f went missing from the generated module without a word
    def f(x: torch.Tensor, w: torch.Tensor):
        t = torch.exp(x)
        def backward(grad):
            return grad * w * t, grad * t
        return t * w, backward


if __name__ == "__main__":
    def demo(x: torch.Tensor):
        def backward(grad):
            return grad
        return x, backward
