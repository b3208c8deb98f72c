"""Layer norm and RMS norm over the last dimension with hand-written gradients."""
import torch


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, eps: float = 1e-5):
    """Layer norm over the last dim with an elementwise affine transform."""
    mean = x.mean(-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    x_hat = xc * rstd
    def backward(grad):
        g = grad * weight
        grad_x = rstd * (g - g.mean(-1, keepdim=True)
                         - x_hat * (g * x_hat).mean(-1, keepdim=True))
        grad_weight = (grad * x_hat).sum_to_size(weight.shape)
        grad_bias = grad.sum_to_size(bias.shape)
        return grad_x, grad_weight, grad_bias, None
    return x_hat * weight + bias, backward


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6):
    """RMS norm over the last dim with a learned scale."""
    rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    x_hat = x * rstd
    def backward(grad):
        g = grad * weight
        grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return grad_x, (grad * x_hat).sum_to_size(weight.shape), None
    return x_hat * weight, backward


# Example inputs for `s2sgrad check` (float64: the check is then exact to rounding).
S2SGRAD_EXAMPLES = {
    "layer_norm": lambda: (
        (torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64),
         torch.randn(6, dtype=torch.float64)),
        {"eps": 1e-3},
    ),
    "rms_norm": lambda: (torch.randn(4, 6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)),
}
