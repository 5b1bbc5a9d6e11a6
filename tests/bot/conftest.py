"""Fixtures for the bot: a fresh PostgreSQL database and Redis namespace per test session, our own
GitHub server per test, real git repositories as PR remotes, and a real Celery worker (in a thread)
consuming both queues with the fake evaluation installed under the pipeline's task name."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.paths import GITHUB
from tests.services import REDIS, redis_namespace  # noqa: F401  (REDIS: the bot tests import it from here)

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PAYLOADS = GITHUB / "payloads"
SECRET = "test-webhook-secret-" + secrets.token_hex(4)
# The in-process GPU worker's own result key (it reads the env at run time; the bot side knows it by id).
WORKER_ID, WORKER_KEY = "test-gpu", "worker-key-" + secrets.token_hex(8)
APP_ID = 29310
INSTALLATION_ID = 1


def _pg_connect(dbname: str = "postgres"):
    import psycopg2
    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=dbname, connect_timeout=3)
    conn.autocommit = True
    return conn


@contextmanager
def scratch_database(tag: str):
    """A new, empty PostgreSQL database (its URL), dropped afterwards; the test skips where there is none."""
    try:
        conn = _pg_connect()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"PostgreSQL on 127.0.0.1:5432 is not reachable: {exc}")
    name = f"tokengate_{tag}_{secrets.token_hex(4)}"
    url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url
    finally:
        from bot.db.engine import engine_for
        engine_for(url).dispose()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


@pytest.fixture(scope="session")
def pg_url():
    with scratch_database("test") as url:
        yield url


@pytest.fixture(scope="session")
def redis_ns():
    """A dedicated db number and key prefix; every key under the prefix is deleted afterwards."""
    with redis_namespace("test") as (url, _, prefix):
        yield url, prefix


@pytest.fixture(scope="session")
def rsa_key():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


@pytest.fixture(scope="session")
def migrated(pg_url):
    from bot.db import migrate
    migrate.upgrade(pg_url)
    return pg_url


@pytest.fixture(scope="package")
def celery_app(redis_ns):
    """The process-wide app on this session's Redis namespace, with the fake evaluation installed under the
    pipeline's task name for as long as tests/bot runs (then whatever held the name before is put back, so
    the worker tests that follow in the same session get the real task)."""
    from bot.testing.fake_evaluation import install
    from worker.queue import app as shared
    broker, prefix = redis_ns
    shared.configure(broker, broker, key_prefix=prefix)
    os.environ.update(TOKENGATE_WORKER_ID=WORKER_ID, TOKENGATE_WORKER_KEY=WORKER_KEY)
    import bot.queue.tasks  # noqa: F401  (publish tasks)
    undo = install(shared.app)
    yield shared.app
    undo()


@pytest.fixture(scope="package")
def celery_worker(celery_app):
    """One real worker thread consuming `gpu` and `publish` (threads pool: a running evaluation does not
    block publishing); stopped when tests/bot is done."""
    from celery.contrib.testing.worker import start_worker
    with start_worker(celery_app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING",
                      queues=["gpu", "publish"], shutdown_timeout=30) as worker:
        yield worker


@dataclass
class Remote:
    """A real git repository standing in for the PR's remote."""
    path: Path

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.path), *args], check=True, capture_output=True,
                               text=True).stdout.strip()

    def commit(self, branch: str, message: str, base: str | None = None) -> str:
        """Add a commit on `branch` (created from `base` when new); returns its SHA."""
        exists = subprocess.run(["git", "-C", str(self.path), "rev-parse", "--verify", "-q", branch],
                                capture_output=True).returncode == 0
        self.git("checkout", "-q", branch if exists else "-b", *( [] if exists else [branch, base or "main"]))
        f = self.path / f"{branch.replace('/', '_')}.txt"
        f.write_text(f.read_text() + message + "\n" if f.exists() else message + "\n")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        sha = self.git("rev-parse", "HEAD")
        self.git("checkout", "-q", "main")
        return sha


@pytest.fixture
def remote(tmp_path) -> Remote:
    path = tmp_path / "Hello-World"
    path.mkdir()
    r = Remote(path)
    r.git("init", "-q", "-b", "main")
    r.git("config", "user.email", "ci@example.com")
    r.git("config", "user.name", "CI")
    (path / "README.md").write_text("hello\n")
    r.git("add", "-A")
    r.git("commit", "-q", "-m", "initial")
    return r


@pytest.fixture
def github(rsa_key, remote):
    from bot.testing.github_server import FakeGitHub
    server = FakeGitHub(app_id=APP_ID, public_key_pem=rsa_key[1], installation_id=INSTALLATION_ID).start()
    repo = server.add_repo("Codertocat", "Hello-World", remote.path)
    repo.permissions.update({"codertocat": "admin", "maintainer": "maintain", "outsider": "read"})
    yield server
    server.stop()


@pytest.fixture
def settings(migrated, redis_ns, rsa_key, github, celery_app):
    """Service settings pointing at this test's GitHub server, the session's database and Redis."""
    from bot.github.client import reset_github_app
    from bot.settings import Settings, override_settings
    from worker.config import EvalSettings
    broker, prefix = redis_ns
    s = Settings(environment="test", database_url=migrated, broker_url=broker, redis_key_prefix=prefix,
                 webhook_secret=SECRET, app_id=APP_ID, private_key=rsa_key[0], github_api_url=github.base_url,
                 github_seconds_between_requests=0, github_seconds_between_writes=0, permission_cache_s=30,
                 eval=EvalSettings(retries=1, retry_backoff_s=0.0), worker_keys={WORKER_ID: WORKER_KEY})
    override_settings(s)
    reset_github_app()
    _truncate(migrated)
    yield s
    override_settings(None)
    reset_github_app()


def _truncate(url: str, attempts: int = 5) -> None:
    """Empty every table. A previous test's background work may still hold row locks; where PostgreSQL
    picks this TRUNCATE as a deadlock's victim (or it waits past the lock timeout), try again."""
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from bot.db.engine import engine_for
    from bot.db.models import Base
    names = ", ".join(t.name for t in Base.metadata.sorted_tables)
    engine = engine_for(url)
    for attempt in range(attempts):
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(text("SET LOCAL lock_timeout = '5s'"))
                conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
            return
        except OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


# ---- webhook helpers ------------------------------------------------------------------------------

def load_payload(name: str) -> dict:
    return json.loads((PAYLOADS / f"{name}.json").read_text())


def pr_payload(github, remote: Remote, action: str, *, number: int = 2, author: str = "Codertocat",
               head_ref: str = "changes", sender: str | None = None, labels=(), label: str | None = None) -> dict:
    """GitHub's pull_request example, re-pointed at our server's repository and real git SHAs."""
    from bot.testing.github_server import PullState
    repo = github.repos["codertocat/hello-world"]
    pr = repo.pulls.setdefault(number, PullState(number=number, title=f"PR {number}", author=author,
                                                 head_ref=head_ref, base_ref="main"))
    pr.labels = list(dict.fromkeys([*pr.labels, *labels]))
    payload = load_payload(f"pull_request.{action if action != 'synchronize' else 'synchronize'}")
    payload["action"] = action
    body = github._urls(github._pull_json(repo, pr))
    payload["pull_request"] = body
    payload["number"] = number
    payload["repository"] = github._urls(github._repo_json(repo))
    payload["installation"] = {"id": INSTALLATION_ID, "node_id": "x"}
    payload["sender"] = github._user(sender or author)
    if label:
        payload["label"] = github._label_json(label)
    return payload


def comment_payload(github, number: int, body: str, login: str) -> dict:
    """issue_comment.created on a pull request (derived: the shared example is on a plain issue)."""
    repo = github.repos["codertocat/hello-world"]
    payload = load_payload("issue_comment.created")
    pr = repo.pulls[number]
    payload["issue"] = github._urls(github._issue_json(repo, pr))
    payload["issue"]["pull_request"] = {"url": f"{github.base_url}/repos/{repo.full_name}/pulls/{number}",
                                        "html_url": f"{github.base_url}/html/{repo.full_name}/pull/{number}",
                                        "diff_url": None, "patch_url": None, "merged_at": None}
    payload["comment"]["body"] = body
    from datetime import datetime, timezone
    payload["comment"]["created_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    payload["comment"]["id"] = 50_000 + len(github.comments)
    payload["comment"]["user"] = github._user(login)
    payload["repository"] = github._urls(github._repo_json(repo))
    payload["installation"] = {"id": INSTALLATION_ID, "node_id": "x"}
    payload["sender"] = github._user(login)
    return payload


def signed_headers(body: bytes, event: str, delivery: str | None = None, secret: str = SECRET) -> dict:
    from bot.github.signature import sign
    return {"Content-Type": "application/json", "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "X-Hub-Signature-256": sign(secret, body),
            "User-Agent": "GitHub-Hookshot/test"}


@pytest.fixture
def client(settings):
    from fastapi.testclient import TestClient

    from bot.web.webhook import create_app
    with TestClient(create_app()) as c:
        yield c


@pytest.fixture
def send(client):
    """POST a signed webhook; returns the response."""
    def _send(event: str, payload: dict, delivery: str | None = None):
        body = json.dumps(payload).encode()
        return client.post("/webhook", content=body, headers=signed_headers(body, event, delivery))
    return _send


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
