# expect: S2S108 8:3
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
	"""x * y."""
	def backward(grad):
		return grad * y, grad * x, None
	return x * y, backward
