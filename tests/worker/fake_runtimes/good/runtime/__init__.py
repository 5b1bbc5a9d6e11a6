"""Test-only fake of the runtime protocol (docs/protocol.md): a small numpy causal-attention model.

It does real work whose cost grows with context (so gates measure something), reads its
weights' seed from the model file's bytes, and is deterministic. `_variant.py` holds the
pieces the fault-injection revisions replace.
"""
import hashlib

import numpy as np

from . import _variant

PROTOCOL_VERSION = 1


class Config:
    def __init__(self, vocab_size, d_model):
        self.vocab_size, self.d_model = vocab_size, d_model


class Engine:
    def __init__(self, path, max_context):
        data = open(path, "rb").read()
        if not data.startswith(b"FAKEGGUF"):
            raise ValueError(f"{path} is not a fake model file")
        rng = np.random.default_rng(int(hashlib.sha256(data).hexdigest()[:8], 16))
        V, d = 1024, 96
        self.config = Config(V, d)
        self.E = rng.standard_normal((V, d))
        self.Wq, self.Wk, self.Wv = (rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(3))
        self.U = rng.standard_normal((d, V)) / np.sqrt(d) * 3.0
        self.max_context = max_context
        self.K = np.zeros((max_context, d))
        self.Vc = np.zeros((max_context, d))
        self.position = 0
        self.last = None

    def _block(self, ids):
        n, p = len(ids), self.position
        if p + n > self.max_context:
            raise ValueError(f"{p + n} tokens exceed max_context {self.max_context}")
        x = self.E[np.asarray(ids)]
        self.K[p:p + n] = x @ self.Wk
        self.Vc[p:p + n] = x @ self.Wv
        q = x @ self.Wq
        s = q @ self.K[:p + n].T / np.sqrt(x.shape[1])
        s = s + _variant.causal_mask(n, p)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        h = 0.5 * x + (s / s.sum(axis=1, keepdims=True)) @ self.Vc[:p + n]
        logits = np.tanh(h) @ self.U
        self.position = p + n
        self.last = logits[-1]
        return logits

    def prefill(self, token_ids, *, all_logits=False):
        ids = [int(t) for t in token_ids]
        out = _variant.prefill_logits(self, ids)
        return out.astype(np.float32) if all_logits else out[-1].astype(np.float32)

    def decode(self, token_id):
        return _variant.decode_step(self, int(token_id)).astype(np.float32)

    def generate_greedy(self, n):
        out = []
        for _ in range(n):
            t = int(np.argmax(self.last))
            out.append(t)
            self.decode(t)
        return _variant.emitted(out)

    def snapshot(self):
        return (self.K.copy(), self.Vc.copy(), self.position, self.last)

    def restore(self, snap):
        self.K, self.Vc, self.position, self.last = snap[0].copy(), snap[1].copy(), snap[2], snap[3]

    def reset(self):
        self.position, self.last = 0, None

    def synchronize(self):
        pass

    def memory_stats(self):
        return {"weights_bytes": int(self.E.nbytes + self.U.nbytes), "state_bytes": int(self.K.nbytes * 2),
                "peak_bytes": None}


def load_engine(gguf_path, *, device="cpu", max_context=4096, backend="auto"):
    _variant.on_load()
    return Engine(gguf_path, max_context)
