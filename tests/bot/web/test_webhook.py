"""Signature checks, dedupe and routing of POST /webhook (raw GitHub payload bytes, re-signed)."""
from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import func, select

from bot.db.engine import session_scope
from bot.db.models import Delivery
from bot.github.signature import sign, verify
from tests.bot.conftest import PAYLOADS, SECRET, pr_payload, signed_headers, wait_until
from tests.bot.helpers import evaluations, processed

pytestmark = pytest.mark.services


def deliveries() -> int:
    with session_scope() as s:
        return s.scalar(select(func.count()).select_from(Delivery))


def test_verify_is_exact():
    body = b'{"a": 1}'
    good = sign("s3cret", body)
    assert verify("s3cret", body, good)
    assert not verify("s3cret", body + b" ", good)
    assert not verify("other", body, good)
    assert not verify("s3cret", body, None)
    assert not verify("s3cret", body, good.replace("sha256=", "sha1="))
    assert not verify("s3cret", body, "sha256=" + "é" * 64)  # non-ASCII: invalid, not an exception


@pytest.mark.parametrize("case", ["missing", "forged", "non-ascii", "wrong-secret", "tampered-body"])
def test_bad_signature_is_401_and_stores_nothing(client, case):
    body = (PAYLOADS / "ping.json").read_bytes()  # raw bytes, exactly as GitHub sent them
    headers = signed_headers(body, "ping")
    if case == "missing":
        del headers["X-Hub-Signature-256"]
    elif case == "forged":
        headers["X-Hub-Signature-256"] = "sha256=" + "0" * 64
    elif case == "non-ascii":
        headers["X-Hub-Signature-256"] = ("sha256=" + "\xe9" * 64).encode("latin-1")
    elif case == "wrong-secret":
        headers["X-Hub-Signature-256"] = sign("not-the-secret", body)
    else:
        body = body.replace(b'"zen"', b'"Zen"')
    r = client.post("/webhook", content=body, headers=headers)
    assert r.status_code == 401
    assert deliveries() == 0


def test_replayed_delivery_is_not_queued_twice(settings, celery_worker, github, remote, client):
    """GitHub's redelivery (same X-GitHub-Delivery, same signed body) is acknowledged but never re-queued."""
    remote.commit("changes", "speed up (xl)")
    body = json.dumps(pr_payload(github, remote, "opened")).encode()
    delivery = str(uuid.uuid4())
    first = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request", delivery))
    replay = client.post("/webhook", content=body, headers=signed_headers(body, "pull_request", delivery))
    assert (first.status_code, first.json()["status"]) == (202, "queued")
    # Not processed yet: queued again (GitHub redelivers what we answered 503); processed: a duplicate.
    assert (replay.status_code, replay.json()["status"]) in ((200, "duplicate"), (202, "queued"))
    wait_until(lambda: processed(delivery), what="delivery processed")
    wait_until(lambda: evaluations() and not evaluations()[0].state.active, what="evaluation")
    assert len(evaluations()) == 1
    assert len(github.requests_for("checks/create")) == 1


def test_duplicate_events_with_new_delivery_ids_do_not_duplicate_evaluations(settings, celery_worker, github,
                                                                             remote, send):
    """Two deliveries for the same head (opened + reopened racing) give one evaluation, not two."""
    remote.commit("changes", "block until released")
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    send("pull_request", pr_payload(github, remote, "opened"), delivery=a)
    send("pull_request", pr_payload(github, remote, "reopened"), delivery=b)
    wait_until(lambda: processed(a) and processed(b), what="both deliveries")
    assert len(evaluations()) == 1
    import redis
    broker, prefix = settings.broker_url, settings.redis_key_prefix
    redis.Redis.from_url(broker).set(f"{prefix}tokengate:result:release:{evaluations()[0].head_sha}", 1, ex=60)
    wait_until(lambda: not evaluations()[0].state.active, what="evaluation")


def test_installation_events_are_recorded(settings, celery_worker, send):
    from bot.db.models import Installation, Repository
    payload = json.loads((PAYLOADS / "installation.created.json").read_text())
    d = str(uuid.uuid4())
    assert send("installation", payload, delivery=d).status_code == 202
    wait_until(lambda: processed(d), what="installation delivery")
    with session_scope() as s:
        inst = s.get(Installation, payload["installation"]["id"])
        assert inst.account_login == payload["installation"]["account"]["login"]
        names = {r.full_name for r in s.scalars(select(Repository))}
    assert names == {r["full_name"] for r in payload["repositories"]}


def test_unknown_events_and_bad_bodies(client):
    body = b'{"zen": "x"}'
    r = client.post("/webhook", content=body, headers=signed_headers(body, "star"))
    assert (r.status_code, r.json()["status"]) == (202, "ignored")
    body = b"not json"
    assert client.post("/webhook", content=body, headers=signed_headers(body, "ping")).status_code == 400
    headers = signed_headers(b"{}", "ping")
    del headers["X-GitHub-Delivery"]
    assert client.post("/webhook", content=b"{}", headers=headers).status_code == 400
    assert deliveries() == 0


def test_secret_is_compared_against_settings(client):
    body = b"{}"
    assert client.post("/webhook", content=body, headers=signed_headers(body, "ping", secret=SECRET + "x")
                       ).status_code == 401
