"""Redis ACL rules for the broker's users (docker-compose.yml spells the same rules for an empty prefix).

web (web app, publish worker): every key and command under the deployment's prefix.
gpu (one user per GPU worker): consume the `gpu` queue and write results, nothing more. The patterns are
kombu's keys for the gpu queue (its list and priority lists `gpu\\x06\\x16N`), the routing tables
(`_kombu.binding*`, also `_kombu.binding_permanent.*`), the worker's control mailbox
(`<host>.celery.pidbox`), the unacknowledged-message hash/index/mutex (acks_late), Celery's result keys
(`celery-task-meta-*`) and our heartbeat and result-cache keys; the publish queue is write-only (`%W~`):
a GPU worker pushes its started/result messages there but can never read or take one.
"""
from __future__ import annotations

GPU_KEYS = ("gpu*", "_kombu.binding*", "unacked*", "celery-task-meta-*", "tokengate:alive:*",
            "tokengate:result:*", "*.celery.pidbox*")  # the last: the worker's own control mailbox
GPU_WRITE_ONLY = ("publish*",)
GPU_COMMANDS = ("+@all", "-@dangerous", "-@admin")  # the keys are the fence; no FLUSHALL, CONFIG, KEYS, ACL


def web_rules(password: str, prefix: str = "") -> list[str]:
    return ["on", f">{password}", f"~{prefix}*", "&*", "+@all"]


def gpu_rules(password: str, prefix: str = "") -> list[str]:
    return ["on", f">{password}", *(f"~{prefix}{k}" for k in GPU_KEYS),
            *(f"%W~{prefix}{k}" for k in GPU_WRITE_ONLY), "&*", *GPU_COMMANDS]
