"""Output-file tricks: FIFOs, symlinks and a huge sparse file where the parent used to read logits."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


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
