"""End to end with the processes docker-compose.yml defines, started natively as subprocesses.

`tokengate db upgrade` (one-shot, fresh PostgreSQL database) → `tokengate serve` (uvicorn) →
`tokengate worker --queues publish --beat` and `tokengate worker --queues gpu` (no GitHub or
database credentials), our GitHub REST server and a real git repository as the PR remote.
A signed `pull_request.opened` goes over HTTP; the sticky comment, the completed check run and
the labels must appear on the server; a `synchronize` push then edits the same comment.

Two tests: one drives the service with the fake evaluation (`--include bot.testing.fake_gpu_tasks`:
verdicts chosen by commit message, an evaluation that blocks so its worker can be killed and the
watchdog seen at work); one runs the real pipeline (worker.queue.tasks, tiny model, CPU quick profile) on
a clone of this repository whose PR branch carries a real decode slowdown.
TOKENGATE_E2E_EVAL=fake skips the real one; =real makes a missing pipeline a failure, not a skip.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from bot.render import STICKY_MARKER
from bot.github.signature import sign
from tests.bot.conftest import APP_ID, comment_payload, pr_payload, scratch_database, wait_until
from tests.services import redis_namespace
from bot.testing.native_stack import ENV_EXAMPLE, NativeStack, parse_env_file

pytestmark = [pytest.mark.services, pytest.mark.slow]

# Names a GPU worker must never see (it returns result records; the bot side publishes them).
CREDENTIALS = ("TOKENGATE_APP_ID", "TOKENGATE_PRIVATE_KEY", "TOKENGATE_PRIVATE_KEY_PATH", "TOKENGATE_WEBHOOK_SECRET",
               "TOKENGATE_DATABASE_URL", "POSTGRES_PASSWORD", "TOKENGATE_WORKER_KEYS")
WAIT_S = 60.0
# A fast watchdog so a vanished gpu worker is noticed within seconds (production: minutes).
WATCHDOG = {"TOKENGATE_WATCHDOG_INTERVAL_S": "1", "TOKENGATE_WATCHDOG_LOST_AFTER_S": "3",
            "TOKENGATE_HEARTBEAT_TTL_S": "2"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_db():
    """An empty PostgreSQL database, dropped afterwards (the migration step must build it from nothing)."""
    with scratch_database("e2e") as url:
        yield url


@pytest.fixture
def fresh_redis():
    """A key prefix of its own (the in-process test worker must not steal these tasks); keys removed after."""
    with redis_namespace("e2e") as (url, client, prefix):
        yield url, prefix, client


def real_pipeline_available() -> str | None:
    """None when the real pipeline can run here, else why not."""
    import importlib.util
    if os.environ.get("TOKENGATE_E2E_EVAL") == "fake":
        return "TOKENGATE_E2E_EVAL=fake"
    missing = [m for m in ("worker.queue.tasks", "worker.pipeline", "worker.cli") if importlib.util.find_spec(m) is None]
    if missing:
        if os.environ.get("TOKENGATE_E2E_EVAL") == "real":
            pytest.fail(f"TOKENGATE_E2E_EVAL=real but {missing} are not importable")
        return f"the evaluation pipeline is not here yet ({', '.join(missing)})"
    return None


@pytest.fixture
def stack(tmp_path, fresh_db, fresh_redis, rsa_key, github):
    """The compose services natively: the env file filled in from .env.example, compose's broker users
    created on the local Redis (per-test names, the compose rules with this test's key prefix)."""
    from bot.queue import acl
    broker, prefix, client = fresh_redis
    secret_file = tmp_path / "secrets" / "github_app_key"
    secret_file.parent.mkdir()
    secret_file.write_text(rsa_key[0])
    secret_file.chmod(0o600)
    webhook_secret = "e2e-" + secrets.token_hex(8)
    tag = secrets.token_hex(4)
    users = {"web": f"tg-e2e-web-{tag}", "gpu0": f"tg-e2e-gpu0-{tag}", "gpu1": f"tg-e2e-gpu1-{tag}"}
    db = make_url(fresh_db)

    def localize(value: str) -> str:  # compose's host names, users and mounts → this machine
        for user, name in users.items():
            value = value.replace(f"redis://{user}:", f"redis://{name}:")
        return (value.replace("@redis:6379/0", "@127.0.0.1:6379/13")
                .replace("tokengate:" + env["POSTGRES_PASSWORD"] + "@postgres:5432/tokengate",
                         f"postgres@127.0.0.1:5432/{db.database}")
                .replace("/run/secrets/github_app_key", str(secret_file)))

    # The env file as an operator fills it from .env.example, then the test-only knobs of the bot side.
    example = parse_env_file(ENV_EXAMPLE.read_text())
    env = dict(example)
    env.update(TOKENGATE_ENVIRONMENT="test", TOKENGATE_WEBHOOK_SECRET=webhook_secret, TOKENGATE_APP_ID=str(APP_ID),
               POSTGRES_PASSWORD="pg-" + tag, **{k: secrets.token_hex(8) for k in example
                                                 if k.startswith(("REDIS_", "TOKENGATE_WORKER_KEY_"))})
    for user, name in users.items():
        client.execute_command("ACL", "SETUSER", name, "reset",
                               *(acl.web_rules if user == "web" else acl.gpu_rules)(
                                   env[f"REDIS_{user.upper()}_PASSWORD"], prefix))
    bot_knobs = dict(TOKENGATE_GITHUB_API_URL=github.base_url, TOKENGATE_GITHUB_SECONDS_BETWEEN_REQUESTS="0",
                     TOKENGATE_GITHUB_SECONDS_BETWEEN_WRITES="0", TOKENGATE_REDIS_KEY_PREFIX=prefix,
                     TOKENGATE_EVAL__RETRY_BACKOFF_S="0", TOKENGATE_OUTBOX_INTERVAL_S="1", **WATCHDOG)
    s = NativeStack(tmp_path / "stack", app_env=env, localize=localize, bot_extra_env=bot_knobs,
                    gpu_extra_env={"TOKENGATE_REDIS_KEY_PREFIX": prefix,
                                   "TOKENGATE_HEARTBEAT_TTL_S": WATCHDOG["TOKENGATE_HEARTBEAT_TTL_S"]})
    s.database_url = fresh_db
    s.redis, s.prefix = fresh_redis[2], prefix
    s.webhook_secret = webhook_secret
    try:
        yield s
    finally:
        s.stop_all()
        for name in users.values():
            client.execute_command("ACL", "DELUSER", name)


def launch(stack: NativeStack, gpu_extra: tuple[str, ...] = ()) -> tuple[str, dict]:
    """Compose's order: the one-shot migration on the empty database, then web, publish (+beat) and gpu.
    Returns the web app's URL and the processes by service name."""
    migrate = stack.run_once("migrate")
    assert migrate.returncode == 0, migrate.stderr
    from sqlalchemy import create_engine, inspect
    engine = create_engine(stack.database_url)
    assert {"evaluations", "deliveries", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()

    port = _free_port()
    web = stack.start("web", replace={"--host": "127.0.0.1", "--port": str(port)})
    publish = stack.start("publish-worker", extra=("--beat-schedule", str(stack.workdir / "beat-schedule")))
    gpu = stack.start("gpu-worker-0", extra=gpu_extra)
    for proc in (publish, gpu):
        stack.wait_for_log(proc, " ready.", timeout=WAIT_S)
    url = f"http://127.0.0.1:{port}"
    _wait(stack, lambda: _healthy(url), f"web app on {url}")

    # The GPU side holds no credentials — checked on the live processes, not on the spec.
    for p in gpu.tree():
        leaked = set(p.environ()) & set(CREDENTIALS)
        assert not leaked, f"gpu worker pid {p.pid} sees {sorted(leaked)}"
        assert not any(stack.webhook_secret in v or "PRIVATE KEY" in v for v in p.environ().values())
    assert set(CREDENTIALS) - {"TOKENGATE_PRIVATE_KEY", "POSTGRES_PASSWORD"} <= set(publish.tree()[0].environ())
    return url, {"web": web, "publish": publish, "gpu": gpu}


def assert_healthy_logs(stack: NativeStack) -> None:
    for proc in stack.procs:
        if proc.killed:
            continue
        assert proc.alive(), f"{proc.name} died:\n{proc.output()[-4000:]}"
        assert "unregistered task" not in proc.output().lower(), f"{proc.name} got a task for the other queue"
        assert "Traceback" not in proc.output(), f"{proc.name} logged an error:\n{proc.output()[-4000:]}"


def test_compose_processes_end_to_end(stack, github, remote):
    """Fake evaluation: opened → XL, push → REJECT (same comment), redelivery, then a vanished gpu worker."""
    t0 = time.monotonic()
    repo = github.repos["codertocat/hello-world"]
    gpu_extra = ("--include", "bot.testing.fake_gpu_tasks")
    url, procs = launch(stack, gpu_extra)
    gpu = procs["gpu"]
    t_up = time.monotonic() - t0

    # 3. A signed pull_request.opened by a trusted author.
    sha1 = remote.commit("changes", "speed up decode (xl)")
    r = _post(url, stack.webhook_secret, "pull_request", pr_payload(github, remote, "opened"))
    assert r.status_code == 202, r.text
    run1 = _wait_completed_check(github, sha1, stack)
    assert run1["conclusion"] == "success" and run1["name"] == "tokengate"
    # queued → (in_progress) → completed: a fake evaluation can finish before its "started" message is
    # handled (two publish threads), so in_progress is asserted on the long evaluation in step 5.
    statuses = [h.get("status") for h in run1["history"]]
    assert statuses[0] == "queued" and statuses[-1] == "completed" and set(statuses) <= {
        "queued", "in_progress", "completed"}, statuses
    _wait(stack, lambda: repo.pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"], "XL labels")
    (comment,) = _wait_sticky(github, lambda b: "`eval:XL`" in b and sha1[:7] in b, stack)
    t_first = time.monotonic() - t0

    # 4. A new push: the same comment is edited (not a second one), labels replaced.
    sha2 = remote.commit("changes", "refactor (slow)")
    push = pr_payload(github, remote, "synchronize")
    delivery = str(uuid.uuid4())
    r = _post(url, stack.webhook_secret, "pull_request", push, delivery)
    assert r.status_code == 202, r.text
    run2 = _wait_completed_check(github, sha2, stack)
    assert run2["conclusion"] == "failure" and run2["id"] != run1["id"]
    (comment2,) = _wait_sticky(github, lambda b: "`eval:REJECT`" in b and "Earlier runs (1)" in b, stack)
    assert comment2["id"] == comment["id"] and comment2["edits"] >= 1
    _wait(stack, lambda: "eval:REJECT" in repo.pulls[2].labels and "eval:XL" not in repo.pulls[2].labels,
          "REJECT label")
    assert len(github.requests_for("issues/create-comment")) == 1

    # GitHub's redelivery of that push is answered without queueing anything; a forged one is refused.
    again = _post(url, stack.webhook_secret, "pull_request", push, delivery)
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    assert _post(url, "not-the-secret", "pull_request", push).status_code == 401

    # 5. The gpu worker vanishes mid-evaluation: the publish worker's beat (watchdog) notices the missing
    #    heartbeat, marks the attempt INFRA (worker lost) and queues the retry, which a new worker finishes.
    sha3 = remote.commit("changes", "hold the GPU (block)")
    r = _post(url, stack.webhook_secret, "pull_request", pr_payload(github, remote, "synchronize"))
    assert r.status_code == 202, r.text
    lost = _wait(stack, lambda: _check_for(github, sha3, status="in_progress"), f"evaluation of {sha3[:7]} running")
    # While the worker lives, its heartbeat keeps the long evaluation safe from the watchdog.
    time.sleep(float(WATCHDOG["TOKENGATE_WATCHDOG_LOST_AFTER_S"]) + 1.5)
    assert github.check_runs[lost["id"]]["status"] == "in_progress", stack.logs()
    stack.kill(gpu)
    t_kill = time.monotonic()
    _wait(stack, lambda: github.check_runs[lost["id"]]["conclusion"] == "action_required", "watchdog verdict")
    t_noticed = time.monotonic() - t_kill
    _wait_sticky(github, lambda b: "stopped responding" in b and "Retrying automatically" in b, stack)
    assert repo.pulls[2].labels == ["eval:INFRA"]
    stack.redis.set(f"{stack.prefix}tokengate:result:release:{sha3}", 1)  # the retry's fake evaluation returns at once
    gpu = stack.start("gpu-worker-0", extra=gpu_extra)
    retry = _wait(stack, lambda: _check_for(github, sha3, status="completed", conclusion="success"), "retry")
    assert retry["id"] != lost["id"]
    (comment3,) = _wait_sticky(github, lambda b: "`eval:XL`" in b and "attempt 2" in b, stack)
    assert comment3["id"] == comment["id"]
    _wait(stack, lambda: repo.pulls[2].labels == ["eval:XL", "eval-qwen35-tiny:XL"], "XL labels after the retry")
    assert len(github.requests_for("issues/create-comment")) == 1

    assert_healthy_logs(stack)
    print(f"native e2e (fake evaluation): services up {t_up:.1f} s, first verdict {t_first:.1f} s, "
          f"lost worker noticed in {t_noticed:.1f} s, total {time.monotonic() - t0:.1f} s")


REAL_WAIT_S = 300.0


@pytest.mark.sandbox
@pytest.mark.timed  # the real pipeline runs in the worker subprocess
def test_compose_processes_real_pipeline(stack, github, tmp_path):
    """The real `tokengate.evaluate` (tiny model, CPU quick profile) on a clone of this repository whose PR
    branch makes every decode step do its work twice: a REJECT with a decode regression, published."""
    why = real_pipeline_available()
    if why:
        pytest.skip(why)
    from worker.cli import make_demo_repo
    t0 = time.monotonic()
    path, base_sha, head_ref = make_demo_repo(tmp_path / "demo")
    subprocess.run(["git", "-C", str(path), "branch", "-f", "main", base_sha], check=True, capture_output=True)
    repo = github.add_repo("Codertocat", "Hello-World", path)
    repo.permissions.update({"codertocat": "admin"})
    url, procs = launch(stack)
    t_up = time.monotonic() - t0

    r = _post(url, stack.webhook_secret, "pull_request",
              pr_payload(github, None, "opened", head_ref=head_ref))
    assert r.status_code == 202, r.text
    head_sha = github.sha(repo, head_ref)
    run = _wait(stack, lambda: _check_for(github, head_sha, status="completed"), "real evaluation", REAL_WAIT_S)
    t_eval = time.monotonic() - t0 - t_up
    (comment,) = _wait_sticky(github, lambda b: "`eval:" in b, stack)
    assert run["conclusion"] == "failure", f"{run['output']}\n{comment['body']}"
    labels = repo.pulls[2].labels
    assert "eval:REJECT" in labels and any(x.startswith("regression-qwen35-tiny-decode@") for x in labels), labels
    assert "**regression**" in comment["body"] and "decode@" in comment["body"]

    # A maintainer's `/eval rerun` of the same head: the worker's result store answers at once (same
    # repo, PR, head, profile), and the same comment is edited with the first run collapsed below.
    t1 = time.monotonic()
    r = _post(url, stack.webhook_secret, "issue_comment", comment_payload(github, 2, "/eval rerun", "codertocat"))
    assert r.status_code == 202, r.text
    from sqlalchemy import create_engine, text
    engine = create_engine(stack.database_url)

    def both_done():
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT state, verdict, result, check_run_id FROM evaluations ORDER BY id")).all()
        return rows if len(rows) == 2 and all(row.state == "done" for row in rows) else None
    try:
        rows = _wait(stack, both_done, "re-run", WAIT_S)
    finally:
        engine.dispose()
    assert [row.verdict for row in rows] == ["REJECT", "REJECT"]
    assert rows[1].result["receipt"].get("reused_from_cache") is True
    rerun = github.check_runs[rows[1].check_run_id]
    assert (rerun["head_sha"], rerun["status"], rerun["conclusion"]) == (head_sha, "completed", "failure")
    (comment2,) = _wait_sticky(github, lambda b: "Earlier runs (1)" in b, stack)
    assert comment2["id"] == comment["id"] and len(github.requests_for("issues/create-comment")) == 1
    out = os.environ.get("TOKENGATE_E2E_COMMENT_OUT")  # keep the real comment (docs/examples/)
    if out:
        Path(out).write_text(comment["body"])
    assert_healthy_logs(stack)
    print(f"native e2e (real pipeline): services up {t_up:.1f} s, evaluation {t_eval:.1f} s, "
          f"cached re-run {time.monotonic() - t1:.1f} s, total {time.monotonic() - t0:.1f} s")


# ---- helpers ------------------------------------------------------------------------------------

def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _post(url: str, secret: str, event: str, payload: dict, delivery: str | None = None) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event,
               "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "X-Hub-Signature-256": sign(secret, body),
               "User-Agent": "GitHub-Hookshot/test"}
    return httpx.post(f"{url}/webhook", content=body, headers=headers, timeout=10)


def _check_for(github, sha: str, **fields) -> dict | None:
    with github.lock:
        runs = [dict(r) for r in github.check_runs.values()
                if r["head_sha"] == sha and all(r.get(k) == v for k, v in fields.items())]
    return runs[-1] if runs else None


def _wait_completed_check(github, sha: str, stack: NativeStack) -> dict:
    def done():
        with github.lock:
            runs = [r for r in github.check_runs.values() if r["head_sha"] == sha and r["status"] == "completed"]
        return runs[0] if runs else None
    return _wait(stack, done, f"completed check run for {sha[:7]}")


def _wait_sticky(github, predicate, stack: NativeStack) -> list[dict]:
    def found():
        with github.lock:
            ours = [dict(c) for c in github.comments.values() if c["body"].startswith(STICKY_MARKER)]
        return ours if ours and all(predicate(c["body"]) for c in ours) else None
    return _wait(stack, found, "sticky comment")


def _wait(stack: NativeStack, predicate, what: str, timeout: float = WAIT_S):
    try:
        return wait_until(predicate, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stack.logs()}") from None
