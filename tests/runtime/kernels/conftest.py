"""Kernel tests run on CUDA when present, else on CPU tensors under the Triton interpreter."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import

import pytest  # noqa: E402


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
