"""What a GPU worker signs with its own key (TOKENGATE_WORKER_ID / TOKENGATE_WORKER_KEY; the bot knows each
worker's key by id): the claim it sends when it starts an evaluation's attempt, the attempt's heartbeat,
and the attempt's result.

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


def beat_mac(key: str, task_id: str, t: float) -> str:
    """HMAC-SHA256 over ("alive", task, time): this worker was running this attempt at time t."""
    return _mac(key, ["alive", task_id, round(t, 3)])


def beat_value(task_id: str, hostname: str, now: float) -> str:
    """The heartbeat key's value: signed with this worker's key and stamped, else the bare hostname. Every GPU
    worker can write the heartbeat keys (one ACL pattern), so an unsigned value proves nothing."""
    mine = own_key()
    if mine is None:
        return hostname
    t = round(now, 3)
    return json.dumps({"worker": mine[0], "host": hostname[:200], "t": t, "mac": beat_mac(mine[1], task_id, t)})


def beat_valid(raw: bytes | str | None, task_id: str, keys: dict[str, str], *, now: float, ttl: float,
               claimed_by: str | None = None) -> bool:
    """Whether a heartbeat value shows the attempt alive: with worker keys configured, only a fresh value
    (stamped within `ttl` of now, so a copy replayed after the worker died expires) signed by a known worker — the
    one that claimed the attempt, once one has — counts. Without keys (embedded, development) any value does."""
    if raw is None:
        return False
    if not keys:
        return True
    try:
        v = json.loads(raw)
        worker, t, mac = str(v["worker"]), float(v["t"]), str(v["mac"])
    except (ValueError, TypeError, KeyError):
        return False
    key = keys.get(worker)
    if key is None or (claimed_by is not None and worker != claimed_by) or not (now - ttl <= t <= now + ttl):
        return False
    return hmac.compare_digest(mac.encode(), beat_mac(key, task_id, t).encode())  # bytes: a non-ASCII str would raise


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
