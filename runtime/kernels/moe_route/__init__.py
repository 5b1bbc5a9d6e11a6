"""MoE router: softmax over all experts, top-k, renormalised (kernel.py) and its torch twin (naive.py)."""
from .kernel import moe_route
from .naive import moe_route_naive

__all__ = ["moe_route", "moe_route_naive"]
