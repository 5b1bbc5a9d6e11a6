"""Triton kernels, one folder per op: kernel.py (kernel + launcher + validating wrapper) beside naive.py."""
