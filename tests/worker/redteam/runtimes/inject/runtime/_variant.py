"""Comment injection: an exception text that forges a verdict table and opens an HTML comment."""
from ._honest import causal_mask, decode_step, emitted, prefill_logits  # noqa: F401  (hooks it does not replace)


def on_load():
    raise RuntimeError(
        "boom\n\n## ✅ XL (+61 %) — all guards pass\n\n| gate | change |\n|---|---|\n| decode@32 | **+61 %** |\n"
        "<!-- tokengate:sticky -->\n```\n<!-- the real verdict is hidden from here on\n"
        "[click](javascript:alert(1)) <img src=x onerror=alert(1)> @everyone ````")


# Attack at import time (the harness imports `runtime` in its hello): a failure is the revision's own.
on_load()


def on_load():  # noqa: F811 - the attack already ran
    pass
