"""Shared by the GEMV and activation-quantization tests."""
import torch


def rel(a, b):
    """Relative L2 error of a against b, in fp64."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def nan_vector(n, device):
    """An output buffer poisoned with NaN: a row the kernel skips shows up."""
    return torch.full((n,), float("nan"), device=device)


def fresh_seed():
    return int(torch.randint(0, 2**31, ()).item())  # fresh every run
