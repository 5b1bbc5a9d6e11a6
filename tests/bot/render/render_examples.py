"""Render the sticky comment for a REJECT, an XL and an INFRA verdict into docs/examples/ (the note's
"screenshots as text"). Run: python -m tests.bot.render.render_examples"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from bot import render
from bot.enums import EvalState, Trigger
from bot.testing.fake_evaluation import result_for

OUT = Path(__file__).resolve().parents[3] / "docs" / "examples"
BASE = "9fdf68a3c1d2e4f5a6b7c8d9e0f1a2b3c4d5e6f7"
T0 = datetime(2026, 7, 16, 14, 0, tzinfo=timezone.utc)


def view(i: int, kind: str, head: str, state=EvalState.DONE, attempt=1, max_attempts=3) -> render.RunView:
    result = result_for(kind, repo="acme/runtime", pr=464, base_sha=BASE, head_sha=head, attempt=attempt)
    retrying = state.active and kind == "infra"
    return render.RunView(id=i, state=state, head_sha=head, base_sha=BASE, base_ref="main", attempt=attempt,
                          max_attempts=max_attempts, profile="quick", trigger=Trigger.AUTO.value,
                          requested_by="contributor", created_at=T0 + timedelta(hours=i),
                          duration_s=result.duration_s, result=result, retrying=retrying)


def examples() -> dict[str, str]:
    models = ["qwen35-tiny"]
    common = dict(awaiting_approval=False, approval_label="eval-approved", models=models)
    reject = render.sticky_comment(current=view(1, "slow", "8e7e027aa1"), earlier=[], head_sha="8e7e027aa1",
                                   **common)
    infra_retry = view(2, "infra", "e2f8dce0b2", state=EvalState.QUEUED, attempt=2)
    infra_final = view(2, "infra", "e2f8dce0b2", state=EvalState.INFRA, attempt=3)
    infra = render.sticky_comment(current=infra_final, earlier=[view(1, "slow", "8e7e027aa1")],
                                  head_sha="e2f8dce0b2", **common)
    retrying = render.sticky_comment(current=infra_retry, earlier=[view(1, "slow", "8e7e027aa1")],
                                     head_sha="e2f8dce0b2", **common)
    xl = render.sticky_comment(current=view(3, "xl", "b699eb5c3d"),
                               earlier=[infra_final, view(1, "slow", "8e7e027aa1")], head_sha="b699eb5c3d",
                               **common)
    return {"comment-reject.md": reject, "comment-infra.md": infra, "comment-infra-retrying.md": retrying,
            "comment-xl.md": xl}


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in examples().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
