"""Fault-injection variant: a decode that skips work (short attention window) inside generate_greedy,
which no longer goes through engine.decode nor fills `logits_out`, so no per-step logits come back.
Prefill and the accuracy guard are untouched."""
import numpy as np

from ._work import decode_step, emitted, prefill_logits  # noqa: F401

WINDOW = 8


def causal_mask(n, p):
    m = np.triu(np.full((n, p + n), -np.inf), k=p + 1)
    if n == 1:  # decode: attend to the last WINDOW positions only
        m[0, : max(0, p - WINDOW + 1)] = -np.inf
    return m


def on_load():
    from . import Engine

    def generate_greedy(self, n):  # its own loop: engine.decode is never called
        out = []
        for _ in range(n):
            t = int(np.argmax(self.last))
            out.append(t)
            self._block([t])
        return out

    Engine.generate_greedy = generate_greedy
