"""A fast stand-in for the evaluation pipeline (tests only), installed under the real task name by
`install(app)` (in-process tests) or by importing bot.testing.fake_gpu_tasks (`tokengate worker --include`).

It behaves like the GPU side: reads the head commit from the real git remote in the job, and
returns an `EvalResult.to_dict()`. What it "measures" is chosen by the head commit's message:
  "slow"  → REJECT (a significant decode regression)      "xl"    → XL (+45 % decode)
  "infra" → INFRA (foreign GPU process) on every attempt  "flaky" → INFRA on attempt 1, then XL
  "crash" → the task raises (worker-side failure)          "block" → waits for a Redis key, then XL
                                                            (`tokengate:result:release:<sha>`: a key the
                                                            GPU worker's broker user may read)
  "xl:60" → XL with +60 % (any percentage)                  anything else → none (within noise)
"""
from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from urllib.parse import urlparse

from worker.queue.app import EVALUATE_TASK
# Imported before install() replaces the task it registers (a later first import would put the real one back).
from worker.queue.tasks import sign_result
from worker.records import EvalResult, GateResult, GuardResult, InfraKind, Verdict

BLOCK_TIMEOUT_S = 20.0


def gate(model: str, name: str, base: float, rel: float, *, significant=True, regression=False, scored=False,
         noise=0.015, n_pairs=10, slower=0.012) -> GateResult:
    head = base * (1 + rel)
    return GateResult(model=model, gate=name, metric="decode_tok_s" if name.startswith("decode") else "prefill_tok_s",
                      base_median=base, head_median=head, rel_change=rel, ci_low=rel - 0.012, ci_high=rel + 0.011,
                      noise_floor=max(noise, slower), significant=significant, regression=regression, scored=scored,
                      n_pairs=n_pairs, floor_slower=slower, floor_faster=noise)


def guard(model: str, passed=True, head_top1=0.962, base_top1=0.960, head_kl=0.012, base_kl=0.011) -> GuardResult:
    return GuardResult(model=model, seeds=[11, 23, 47], head_top1=head_top1, base_top1=base_top1, head_kl=head_kl,
                       base_kl=base_kl, top1_floor=0.90, paired_delta=head_top1 - base_top1, max_drop=0.02,
                       kl_bound=0.05, bit_identical=False, passed=passed)


def result_for(kind: str, *, repo: str, pr: int | None, base_sha: str, head_sha: str, attempt: int = 1,
               model: str = "qwen35-tiny", profile: str = "quick", speedup: float = 0.452) -> EvalResult:
    common = dict(repo=repo, pr_number=pr, base_sha=base_sha, head_sha=head_sha, profile=profile, attempt=attempt,
                  receipt={"gpu": "NVIDIA H200", "driver": "test", "harness": "fake", "model_sha256": "0" * 64},
                  duration_s=42.0)
    if kind == "xl":
        return EvalResult(verdict=Verdict.XL, summary=f"Verified speedup: decode@512 on {model} is "
                                                      f"{speedup:.1%} faster.",
                          gates=[gate(model, "decode@512", 410.0, speedup, scored=True),
                                 gate(model, "decode@4096", 380.0, 0.431),
                                 gate(model, "prefill@512", 9100.0, 0.004, significant=False)],
                          guards=[guard(model)], best_speedup=speedup, **common)
    if kind == "slow":
        return EvalResult(verdict=Verdict.REJECT, summary=f"decode@4096 on {model} is 8.1% slower than main "
                                                          "(outside the noise floor).",
                          gates=[gate(model, "decode@512", 410.0, 0.006, significant=False, scored=True),
                                 gate(model, "decode@4096", 380.0, -0.081, regression=True),
                                 gate(model, "prefill@512", 9100.0, -0.002, significant=False)],
                          guards=[guard(model)], best_speedup=0.006, **common)
    if kind == "infra":
        return EvalResult(verdict=Verdict.INFRA, summary="A foreign process held the GPU during measurement.",
                          infra_kind=InfraKind.FOREIGN_GPU_PROCESS,
                          infra_detail="pid 3650689 (936 MiB) appeared on GPU 0 during the decode@4096 pairs",
                          gates=[GateResult(model=model, gate="decode@4096", metric="decode_tok_s", base_median=None,
                                            head_median=None, rel_change=None, ci_low=None, ci_high=None,
                                            noise_floor=None, significant=False, regression=False,
                                            reason="measurement discarded: foreign GPU process")],
                          **common)
    return EvalResult(verdict=Verdict.NONE, summary="No significant change on any gate.",
                      gates=[gate(model, "decode@512", 410.0, 0.003, significant=False, scored=True)],
                      guards=[guard(model)], best_speedup=0.003, **common)


def _message(repo_url: str, sha: str) -> str:
    path = urlparse(repo_url).path if repo_url.startswith("file:") else repo_url
    return subprocess.run(["git", "-C", path, "log", "-1", "--format=%B", sha], check=True, capture_output=True,
                          text=True).stdout.lower()


def fake_evaluate(job: dict) -> dict:
    """Signed like the real task (worker.queue.tasks.sign_result, this worker's env key)."""
    from celery import current_task
    task_id = current_task.request.id if current_task else None
    return sign_result(_fake_evaluate(job), job, task_id)


def _fake_evaluate(job: dict) -> dict:
    message = _message(job["repo_url"], job["head_sha"])
    if "crash" in message:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if "block" in message:
        import redis
        from celery import current_task
        conf = current_task.app.conf
        client = redis.Redis.from_url(conf.broker_url)
        prefix = (conf.broker_transport_options or {}).get("global_keyprefix", "")
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while not client.exists(f"{prefix}tokengate:result:release:{job['head_sha']}") and time.monotonic() < deadline:
            time.sleep(0.05)
    kind = "none"
    for word in ("slow", "xl", "infra", "block"):
        if word in message:
            kind = {"block": "xl"}.get(word, word)
            break
    if "flaky" in message:
        kind = "infra" if job["attempt"] == 1 else "xl"
    pct = re.search(r"xl:(\d+)", message)
    return result_for(kind, repo=job["repo_full_name"], pr=job["pr_number"], base_sha=job["base_sha"],
                      head_sha=job["head_sha"], attempt=job["attempt"], model=(job.get("models") or ["qwen35-tiny"])[0],
                      profile=job["profile"], speedup=int(pct.group(1)) / 100 if pct else 0.452).to_dict()


def install(celery_app) -> Callable[[], None]:
    """Register the fake as `tokengate.evaluate` on this app, in place of whatever holds the name (the
    pipeline's task, when worker.queue.tasks was imported); returns the undo. Nothing happens at import, so
    importing this module for `result_for` leaves the process-wide app alone."""
    registry = celery_app.tasks  # finalizes the app: later registrations are immediate
    previous = registry.pop(EVALUATE_TASK, None)
    celery_app.task(name=EVALUATE_TASK, shared=False)(fake_evaluate)

    def undo() -> None:
        registry.pop(EVALUATE_TASK, None)
        if previous is not None:
            registry[EVALUATE_TASK] = previous
    return undo
