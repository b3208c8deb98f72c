# expect: S2S128 6:10
import torch


def layer_norm(x: torch.Tensor):
    out, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], None, None, 1e-5)
    def backward(grad):
        x_hat = (x - mean) * rstd
        g_hat = grad - grad.mean(-1, keepdim=True)
        return rstd * (g_hat - x_hat * (grad * x_hat).mean(-1, keepdim=True))
    return out, backward
