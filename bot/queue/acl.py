"""Redis ACL rules for the broker's users (docker-compose.yml spells the same rules for an empty prefix).

web (web app, publish worker): every key and command under the deployment's prefix.
gpu (one user per GPU worker): consume the `gpu` queue and write results, nothing more. The patterns are
kombu's keys for the gpu queue (its list and priority lists `gpu\\x06\\x16N`), the unacknowledged-message
hash/index/mutex (acks_late), Celery's result keys (`celery-task-meta-*`) and our heartbeat and result-cache
keys. The routing tables (`_kombu.binding*`) are read-only (`%R~`): the web side declares them
(`declare_queues`) and a GPU worker only looks routes up, so it cannot re-route anyone's messages. The
publish queue is write-only (`%W~`): a GPU worker pushes its started/result messages there but can never
read or take one. No control mailboxes: GPU workers run without remote control, so a GPU user cannot
post commands into another worker's `*.celery.pidbox`.
"""
from __future__ import annotations

# Queue keys exactly: the list and its priority lists `<queue>\x06\x16N` (a bare `publish*` also matched
# `publish@host.celery.pidbox`, the publish worker's control mailbox).
PRIORITY_SEP = "\x06\x16"
GPU_KEYS = ("gpu", f"gpu{PRIORITY_SEP}*", "unacked*", "celery-task-meta-*", "tokengate:alive:*", "tokengate:result:*")
GPU_READ_ONLY = ("_kombu.binding*",)
GPU_WRITE_ONLY = ("publish", f"publish{PRIORITY_SEP}*")
GPU_COMMANDS = ("+@all", "-@dangerous", "-@admin")  # the keys are the fence; no FLUSHALL, CONFIG, KEYS, ACL


def web_rules(password: str, prefix: str = "") -> list[str]:
    return ["on", f">{password}", f"~{prefix}*", "&*", "+@all"]


def gpu_rules(password: str, prefix: str = "") -> list[str]:
    return ["on", f">{password}", *(f"~{prefix}{k}" for k in GPU_KEYS),
            *(f"%R~{prefix}{k}" for k in GPU_READ_ONLY),
            *(f"%W~{prefix}{k}" for k in GPU_WRITE_ONLY), "&*", *GPU_COMMANDS]
