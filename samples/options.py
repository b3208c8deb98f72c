"""Activations and clamps configured by non-tensor and keyword-only options."""
import torch

DEFAULT_NEGATIVE_SLOPE = 0.01


def _gain(mask: torch.Tensor, negative_slope: float, dtype: torch.dtype) -> torch.Tensor:
    """Local slope of a leaky piecewise-linear map: 1 where mask holds, negative_slope elsewhere."""
    return mask.to(dtype) * (1.0 - negative_slope) + negative_slope


def leaky_relu(x: torch.Tensor, *, negative_slope: float = DEFAULT_NEGATIVE_SLOPE):
    """Leaky ReLU: x where x > 0, negative_slope * x elsewhere."""
    gain = _gain(x > 0, negative_slope, x.dtype)
    def backward(grad):
        return grad * gain, None
    return x * gain, backward


def clamp_scale(x: torch.Tensor, lo: float, hi: float, *, scale: float = 2.0, leaky: bool = False):
    """Clamp x to [lo, hi] and multiply by scale.

    With leaky=True values outside [lo, hi] keep a slope of DEFAULT_NEGATIVE_SLOPE.
    """
    inside = (x >= lo) & (x <= hi)
    c = torch.clamp(x, lo, hi)
    if leaky:
        slope = DEFAULT_NEGATIVE_SLOPE
        y = c + slope * (x - c)
    else:
        slope = 0.0
        y = c
    def backward(grad):
        return grad * _gain(inside, slope, grad.dtype) * scale, None, None, None, None
    return y * scale, backward
