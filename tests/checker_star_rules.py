"""A rule whose backward takes `*grads`: s2sgrad rejects it (S2S110), but the checker
still reads its backward first, one gradient per output."""

import torch


def sincos_star_wrong(x: torch.Tensor):
    """sin and cos; backward takes `*grads` and gets cos's sign wrong."""
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(*grads):
        gs, gc = grads
        return gs * c + gc * s
    return (s, c), backward

