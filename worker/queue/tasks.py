"""GPU-side Celery task: `tokengate.evaluate` on queue `gpu` (job dict → EvalResult.to_dict()).

Thin on purpose: the pipeline does the work. Here: one evaluation at a time per device (a file
lock per device on this box; a box with k GPUs runs k workers, each with TOKENGATE_DEVICE=cuda:i),
idempotency by (repo, PR, head SHA, profile) through the result store in Redis, time limits,
acks_late. One attempt per task: an INFRA result goes back to the bot, which re-dispatches with
backoff (attempt + 1). This side never holds GitHub or database credentials.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path

from worker.queue.app import EVALUATE_TASK, app
from worker.config import EvalSettings, gpu_default_profile
from worker.paths import cache_dir, locked
from worker.records import EvalResult, InfraKind, Verdict

SOFT_LIMIT_S = 3 * 3600  # above every profile's eval_timeout_s; the pipeline has its own per-request limits
HARD_LIMIT_S = SOFT_LIMIT_S + 300
RESULT_TTL_S = 7 * 24 * 3600
log = logging.getLogger("tokengate.worker")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PRIVATE", "_KEY", "DATABASE_URL", "BROKER", "BACKEND")


def worker_device() -> str | None:
    """The device this worker owns (TOKENGATE_DEVICE, read when a task runs), or None = the profile's."""
    return os.environ.get("TOKENGATE_DEVICE") or None


def default_profile(settings: EvalSettings) -> str:
    """A job that names no profile: `standard` on a GPU worker, the settings' profile otherwise."""
    return gpu_default_profile() if (worker_device() or "").startswith("cuda") else settings.profile


def trusted_root() -> Path | None:
    """Override of the deployed runtime location (tests); None = the importable `runtime` package."""
    v = os.environ.get("TOKENGATE_TRUSTED_RUNTIME")
    return Path(v) if v else None


def idempotency_key(job: dict) -> str:
    # Base too: a rerun after main moved is a new measurement, not the old verdict (issue 13).
    parts = [job.get("repo_full_name") or job.get("repo_url") or job.get("repo"), job.get("pr_number"),
             job.get("head_sha") or job.get("head_ref"), job.get("profile", "quick"),
             job.get("base_sha") or job.get("base_ref")]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _redis():
    """The result store: the broker's Redis, under the app's key prefix (None when not Redis)."""
    url = app.conf.broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None, ""
    import redis

    prefix = (app.conf.broker_transport_options or {}).get("global_keyprefix", "")
    return redis.Redis.from_url(url), prefix


def cached_result(key: str) -> dict | None:
    client, prefix = _redis()
    if client is None:
        return None
    raw = client.get(f"{prefix}tokengate:result:{key}")
    try:
        entry = json.loads(raw) if raw else None
    except ValueError:
        return None
    return auth.unseal_cached(key, entry)  # only what this worker sealed (see worker/queue/auth.py)


def store_result(key: str, result: dict) -> None:
    client, prefix = _redis()
    if client is not None:
        client.set(f"{prefix}tokengate:result:{key}", json.dumps(auth.seal_cached(key, result), default=str),
                   ex=RESULT_TTL_S)


@contextmanager
def device_lock(device: str):
    """One evaluation at a time on a device of this box (released if the worker dies)."""
    with locked(cache_dir() / "locks" / f"{device.replace(':', '_')}.lock"):
        yield


def _secrets() -> list[str]:
    return [v for k, v in os.environ.items() if any(w in k.upper() for w in _SECRET_WORDS) and len(v) >= 6]


def run_job(job: dict, *, defer_upkeep: bool = False) -> dict:
    """Evaluate one job dict (the task body, callable without Celery). The evaluation's upkeep (its A/A sentinel
    pair, worker/calibration/sentinel.py) runs before this returns, or with `defer_upkeep` once the task's result
    is out (`run_owed_upkeep`, from the task's after_return): the verdict does not wait for it."""
    from worker.pipeline import Evaluation, Job

    settings = EvalSettings.model_validate(job["settings"]) if job.get("settings") else EvalSettings()
    key = idempotency_key(job)
    cached = cached_result(key)
    if cached and cached.get("verdict") != Verdict.INFRA.value:
        cached.setdefault("receipt", {})["reused_from_cache"] = True
        return cached
    j = Job.from_dict({**job, "eval_id": str(job["eval_id"]) if job.get("eval_id") is not None else None,
                       "profile": job.get("profile") or default_profile(settings)})
    j.device = j.device or worker_device()
    try:
        ev = Evaluation(j, settings, trusted_root=trusted_root(), secrets=_secrets())
    except ValueError as exc:  # a job this worker cannot run as asked: not the PR's fault
        r = EvalResult(repo=job.get("repo_full_name") or j.repo, pr_number=j.pr_number, base_sha=j.base_sha or "",
                       head_sha=j.head_sha or "", profile=j.profile, verdict=Verdict.INFRA,
                       summary=f"Infrastructure problem (internal_error), not a measurement of this PR: {exc}",
                       infra_kind=InfraKind.INTERNAL_ERROR, infra_detail=str(exc), attempt=j.attempt)
        return r.to_dict()
    with device_lock(ev.profile.device):
        cached = cached_result(key)  # a duplicate may have finished while we waited for the device
        if cached and cached.get("verdict") != Verdict.INFRA.value:
            cached.setdefault("receipt", {})["reused_from_cache"] = True
            return cached
        _self_calibrate(ev, j)
        result = ev.run().to_dict()
        if not defer_upkeep:
            _upkeep(ev)
    if result["verdict"] != Verdict.INFRA.value:
        store_result(key, result)
    if defer_upkeep:
        _OWED.append(ev)
    return result


_OWED: list = []  # evaluations whose upkeep waits for their task's result to be out (one at a time per worker)


def run_owed_upkeep() -> None:
    """The owed upkeep of this worker's evaluations, each on its device with the device lock held (the next job
    on the device waits for it). A failure is logged, never raised: it is not the verdict's."""
    while _OWED:
        ev = _OWED.pop(0)
        with device_lock(ev.profile.device):
            _upkeep(ev)


def _upkeep(ev) -> None:
    try:
        report = ev.upkeep()
    except Exception:  # noqa: BLE001 - upkeep never changes a verdict that is already out
        log.exception("upkeep of evaluation %s failed", ev.eval_id)
        return
    if report:
        log.info("upkeep of evaluation %s: %s", ev.eval_id, json.dumps(report, default=str)[:2000])


def _self_calibrate(ev, job) -> None:
    """A GPU worker with no usable A/A history for this GPU/driver/torch/triton/protocol, or whose history
    is of another runtime than the job's base, records A/A pairs of the base first
    (worker/calibration/auto.py); a failure leaves the gates uncalibrated, which the verdict then says."""
    if not (ev.settings.auto_calibrate and ev.profile.device.startswith("cuda")):
        return
    from worker.calibration import auto

    if auto.calibrated(ev, auto.base_runtime(ev)):
        return
    try:
        run = auto.calibrate_pairs(job.repo, job.base_ref, ev.settings, store=ev.store, trusted_root=ev.trusted_root,
                                   base_sha=job.base_sha, device=job.device, models=job.models)
        ev._calibration_run = run
    except Exception as exc:  # noqa: BLE001 - calibration is best effort; the verdict says "uncalibrated"
        ev._calibration_run = f"{type(exc).__name__}: {exc}"


# Signing lives in worker/queue/auth.py (the start announcement signs a claim without importing this module).
from worker.queue import auth  # noqa: E402
from worker.queue.auth import RESULT_AUTH, result_mac, sign_result  # noqa: E402,F401  (re-exported)


class _EvaluateTask(app.Task):
    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        # Celery calls this once the result is stored and the link (the bot's publish task) is sent: the A/A
        # sentinel pair runs now, while this worker still holds the job (acks_late) and takes no other.
        run_owed_upkeep()


@app.task(name=EVALUATE_TASK, bind=True, base=_EvaluateTask, acks_late=True, reject_on_worker_lost=True,
          soft_time_limit=SOFT_LIMIT_S, time_limit=HARD_LIMIT_S)
def evaluate(self, job: dict) -> dict:
    done = _stored_result(self)
    if done is not None:  # delivered again after the worker was lost in the upkeep: the verdict is already out
        return done
    return sign_result(run_job(job, defer_upkeep=True), job, self.request.id)


def _stored_result(task) -> dict | None:
    """This task id's stored result, when a delivery of it already succeeded (Celery keeps a SUCCESS; the message
    comes back only because the worker died before its late ack, in the upkeep). None otherwise or unreadable."""
    try:
        done = task.AsyncResult(task.request.id)
        return done.result if done.state == "SUCCESS" and isinstance(done.result, dict) else None
    except Exception:  # noqa: BLE001 - no result store to ask: evaluate as on a first delivery
        return None
