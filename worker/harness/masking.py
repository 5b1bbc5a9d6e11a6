"""Timed prompts are staged masked, and unmasked only inside their timed request.

Every prompt of a sweep is staged (sent, untimed) before any timing starts, so that moving its ids is
never on the clock. Staged in the clear, a revision could compute every answer in `stage` and replay
it when timed (red team: precompute_stage, +400 % decode and +540 % prefill on the fake runtime). So
the parent stages `(ids + k) mod vocab`, with k a keystream from a fresh secret seed per prompt and
role, and sends the seed only with the timed prefill: the driver subtracts k there (worker/harness/
driver.py `_unmask`, the same keystream: SHAKE-256 of the seed as little-endian uint32, mod vocab).
Before that request the staged ids say nothing about the prompt but its length.
"""
from __future__ import annotations

import hashlib
import secrets

import numpy as np


def keystream(seed: bytes, n: int, vocab: int) -> np.ndarray:
    raw = hashlib.shake_256(seed).digest(4 * n)
    return np.frombuffer(raw, dtype="<u4").astype(np.int64) % vocab


def mask(ids: list[int], vocab: int) -> tuple[list[int], str]:
    """(masked ids to stage, the seed to send with the timed request, hex)."""
    seed = secrets.token_bytes(16)
    masked = (np.asarray(ids, dtype=np.int64) + keystream(seed, len(ids), vocab)) % vocab
    return masked.tolist(), seed.hex()
