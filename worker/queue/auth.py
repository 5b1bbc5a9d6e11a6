"""What a GPU worker signs with its own key (TOKENGATE_WORKER_ID / TOKENGATE_WORKER_KEY; the bot knows each
worker's key by id): the claim it sends when it starts an evaluation's attempt, and the attempt's result.

The bot binds an attempt to the first worker whose signed claim (or result) it sees, and from then on
accepts a result for that attempt only under that worker's key (bot/service.py). Both MACs cover the
evaluation id and the attempt's task id, and are domain-separated: neither fits another attempt or the
other kind of message.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

RESULT_AUTH = "_auth"  # {"worker": id, "mac": hex}: the bot accepts a result only with a valid one


def _mac(key: str, parts: list) -> str:
    msg = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key.encode(), msg.encode(), hashlib.sha256).hexdigest()


def result_mac(key: str, result: dict, eval_id, task_id: str | None) -> str:
    """HMAC-SHA256 over (evaluation, task, result) in canonical JSON: a signed result fits one attempt only."""
    return _mac(key, [eval_id, task_id, {k: v for k, v in result.items() if k != RESULT_AUTH}])


def claim_mac(key: str, eval_id, task_id: str | None) -> str:
    """HMAC-SHA256 over ("claim", evaluation, task): this worker has started this attempt."""
    return _mac(key, ["claim", eval_id, task_id])


def own_key() -> tuple[str, str] | None:
    worker, key = os.environ.get("TOKENGATE_WORKER_ID"), os.environ.get("TOKENGATE_WORKER_KEY")
    return (worker, key) if worker and key else None


def sign_result(result: dict, job: dict, task_id: str | None) -> dict:
    """Sign with this worker's own key; unsigned without one (the bot will refuse it)."""
    mine = own_key()
    if mine is None:
        return result
    return {**result, RESULT_AUTH: {"worker": mine[0], "mac": result_mac(mine[1], result, job.get("eval_id"), task_id)}}


def sign_claim(eval_id, task_id: str | None) -> dict | None:
    """{"worker": id, "mac": hex} for the start announcement; None without a key (the bot ignores it)."""
    mine = own_key()
    return None if mine is None else {"worker": mine[0], "mac": claim_mac(mine[1], eval_id, task_id)}


def seal_cached(cache_key: str, result: dict) -> dict:
    """A result-cache entry (worker/queue/tasks.py) sealed with this worker's key. Every GPU worker can write
    the cache keys (one ACL pattern for all), so an entry another worker wrote — a forged verdict it wants
    this worker to sign — must not be reused: a worker reuses only what it sealed itself."""
    mine = own_key()
    if mine is None:
        return {"result": result}
    return {"result": result, "worker": mine[0], "mac": _mac(mine[1], ["cache", cache_key, result])}


def unseal_cached(cache_key: str, entry) -> dict | None:
    """The cached result when this worker sealed it (or, keyless, when nobody did); else None."""
    if not isinstance(entry, dict) or not isinstance(entry.get("result"), dict):
        return None
    mine = own_key()
    if mine is None:
        return entry["result"] if "mac" not in entry else None
    if entry.get("worker") != mine[0] or not isinstance(entry.get("mac"), str):
        return None
    good = _mac(mine[1], ["cache", cache_key, entry["result"]])
    return entry["result"] if hmac.compare_digest(good.encode(), entry["mac"].encode("utf-8", "replace")) else None
