"""Work on a thread that exits before the answer: 3x the decode work, off the live-thread clock."""
import threading

import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    res = {}

    def work():
        p = engine.position
        for _ in range(3):
            engine.position = p
            res["out"] = engine._block([t])[0]

    th = threading.Thread(target=work)
    th.start()
    th.join()  # the thread is gone before the parent reads any clock
    return res["out"]


def emitted(ids):
    return ids


def on_load():
    pass
