"""A gpu-side stand-in that measures the *tree*: tok/s = the number in `speed.txt` at each revision, so a
commit that lowers it slows every later commit too (a real step in main's history, unlike the message
fake). Registered under its own task name; tests point bot.history.measure.EVALUATE at it."""
from __future__ import annotations

import subprocess
from urllib.parse import urlparse

from bot.testing.fake_evaluation import gate, guard
from worker.records import EvalResult, Verdict

TASK = "tokengate.test.tree_speed_evaluate"
GATE = "decode@512"


def speed(repo_url: str, sha: str) -> float:
    path = urlparse(repo_url).path
    return float(subprocess.run(["git", "-C", path, "show", f"{sha}:speed.txt"], check=True, capture_output=True,
                                text=True).stdout)


def evaluate(job: dict) -> dict:
    """Signed like the real task: the bot plots only results a GPU worker's own key signed."""
    from celery import current_task

    from worker.queue.tasks import sign_result
    task_id = current_task.request.id if current_task else None
    return sign_result(_evaluate(job), job, task_id)


def _evaluate(job: dict) -> dict:
    base, head = speed(job["repo_url"], job["base_sha"]), speed(job["repo_url"], job["head_sha"])
    rel = head / base - 1
    g = gate("qwen35-tiny", GATE, base, rel, significant=abs(rel) > 0.02, regression=rel < -0.02, scored=True)
    return EvalResult(repo=job["repo_full_name"], pr_number=None, base_sha=job["base_sha"], head_sha=job["head_sha"],
                      profile=job["profile"], verdict=Verdict.REJECT if rel < -0.02 else Verdict.NONE,
                      summary=f"tree speed {head} vs {base}", gates=[g], guards=[guard("qwen35-tiny")],
                      receipt={"host_key": "tree-fake"}, duration_s=0.1).to_dict()
