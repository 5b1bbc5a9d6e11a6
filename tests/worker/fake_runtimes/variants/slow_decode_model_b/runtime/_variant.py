"""Base for the two-model decoy case (tests/worker/gates/test_gates.py): decode twice as slow on model B only
(E[0,0] < 0: fake_model seed 1)."""
from ._work import causal_mask, emitted, on_load, prefill_logits, repeated  # noqa: F401


def decode_step(engine, t):
    return repeated(engine, [t], 2 if engine.E[0, 0] < 0 else 1)[0]
