"""The GitHub App under load and faults, on loopback only, bounded (issue 15, item 7).

    python scripts/fault_drill.py [--prs 250] [--concurrency 32] [--out bench/receipts/fault-drill-<UTC>.json]

Stands the real stack up natively from docker-compose.yml (bot/testing/native_stack.py): a throwaway
PostgreSQL cluster and a throwaway redis-server (compose's ACL users) on free loopback ports, `db upgrade`,
`serve`, the publish worker with beat and one GPU worker (the fake evaluation, `--include
bot.testing.fake_gpu_tasks`), the test GitHub server and a real git remote. Production defaults except
the GitHub throttle (0: the test server); a process that crashes is started again, as compose's
`restart: unless-stopped` would (listed in the receipt as service_restarts). Then:
  burst   : 2 × PRs signed deliveries (opened + synchronize per PR, shuffled, `concurrency` clients);
            answer p50/p99, dropped (not processed), duplicated (two evaluations or comments of one head),
            PRs left on their older head;
  redis   : deliveries queued, then redis-server restarted without persistence (their messages lost),
            deliveries sent while it is down (503 → stored) — lost = accepted/stored but never processed;
  postgres: the cluster restarted (pg_ctl restart -m fast) while deliveries arrive; 503s are redelivered
            (as GitHub's redeliver would); lost = acknowledged but never processed;
  github  : the GitHub server answers 503 for 60 s to everything; then connection resets after writes;
            lost deliveries and duplicate sticky comments counted;
  gpu kill: kill -9 of the GPU worker's process group mid-evaluation, a new worker started; the time
            until the watchdog has re-dispatched the evaluation (production defaults) and until it is done.
Everything it started is stopped and removed at the end; the JSON receipt is written to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEADLINE_S = 1200  # the whole drill; it stops (and reports what it has) past this


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def wait(pred, timeout: float, what: str, interval: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s: {what}")


class Postgres:
    """A throwaway cluster (run as the postgres user) on a loopback port."""

    def __init__(self, workdir: Path):
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
        if not bins:
            raise SystemExit("PostgreSQL server binaries not found under /usr/lib/postgresql")
        self.bin, self.port = bins[-1], free_port()
        self.data = workdir / "pgdata"
        self.data.mkdir(parents=True)
        shutil.chown(self.data, "postgres")
        shutil.chown(workdir, "postgres")
        self._as_pg(self.bin / "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")

    def _as_pg(self, *cmd) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *map(str, cmd)], check=True, capture_output=True,
                       cwd="/tmp")

    def ctl(self, *args) -> None:
        self._as_pg(self.bin / "pg_ctl", "-D", self.data, "-w", "-l", self.data.parent / "pg.log",
                    "-o", f"-p {self.port} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=on", *args)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/tokengate"


class Redis:
    """A throwaway redis-server, no persistence (a restart loses every message), compose's ACL users."""

    def __init__(self, workdir: Path, users: list[tuple[str, list[str]]]):
        self.port, self.dir, self.users = free_port(), workdir, users
        self.proc = None

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.dir), "--user", "default", "off"]
        for name, rules in self.users:
            args += ["--user", name, *rules]
        self.proc = subprocess.Popen(args, stdout=open(self.dir / "redis.log", "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait(lambda: socket.socket().connect_ex(("127.0.0.1", self.port)) == 0, 10, "redis up")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prs", type=int, default=250)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--outage-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    t_start = time.monotonic()
    receipt: dict = {"started": iso(datetime.now(timezone.utc)), "cpus": os.cpu_count(), "prs": args.prs,
                     "concurrency": args.concurrency}
    work = Path(tempfile.mkdtemp(prefix="tokengate-drill-"))
    os.chmod(work, 0o755)
    stack = pg = rds = github = None
    try:
        receipt.update(run(args, work, receipt, t_start, cleanup := {}))
    except Exception as exc:  # noqa: BLE001 - reported in the receipt
        receipt["error"] = f"{type(exc).__name__}: {exc}"
        import traceback
        traceback.print_exc()
    finally:
        for name in ("stack", "redis", "github"):
            obj = cleanup.get(name) if "cleanup" in dir() else None
            try:
                if name == "stack" and obj:
                    obj.stop_all()
                elif name == "redis" and obj:
                    obj.stop()
                elif name == "github" and obj:
                    obj.stop()
            except Exception:  # noqa: BLE001
                pass
        pg = cleanup.get("pg")
        if pg:
            try:
                pg.ctl("stop", "-m", "immediate")
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(work, ignore_errors=True)
    receipt["wall_s"] = round(time.monotonic() - t_start, 1)
    text = json.dumps(receipt, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if receipt.get("pass") else 1


def run(args, work: Path, receipt: dict, t_start: float, cleanup: dict) -> dict:
    import httpx
    import psycopg2
    from sqlalchemy import create_engine, text

    from bot.github.signature import sign
    from bot.queue import acl
    from bot.testing.github_server import FakeGitHub, PullState
    from bot.testing.native_stack import ENV_EXAMPLE, NativeStack, parse_env_file
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    # ---- services ----------------------------------------------------------------------------------
    pg = cleanup["pg"] = Postgres(work)
    pg.ctl("start")
    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres")
    conn.autocommit = True
    conn.cursor().execute("CREATE DATABASE tokengate")
    conn.close()
    example = parse_env_file(ENV_EXAMPLE.read_text())
    env = dict(example)
    env.update({k: secrets.token_hex(12) for k in example if k.startswith(("REDIS_", "TOKENGATE_WORKER_KEY_"))})
    webhook_secret = secrets.token_hex(16)
    env.update(TOKENGATE_WEBHOOK_SECRET=webhook_secret, TOKENGATE_APP_ID="29310", POSTGRES_PASSWORD="unused")
    rds = cleanup["redis"] = Redis(work, [("web", acl.web_rules(env["REDIS_WEB_PASSWORD"])),
                                          ("gpu0", acl.gpu_rules(env["REDIS_GPU0_PASSWORD"]))])
    rds.start()

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    (work / "secrets").mkdir()
    (work / "secrets" / "key.pem").write_text(private)

    # A real git remote: per PR a branch with two commits (plumbing: fast).
    remote = work / "Hello-World"
    remote.mkdir()
    g = lambda *a, **kw: subprocess.run(["git", "-C", str(remote), *a], check=True, capture_output=True,  # noqa: E731
                                        text=True, **kw).stdout.strip()
    g("init", "-q", "-b", "main")
    g("config", "user.email", "ci@example.com")
    g("config", "user.name", "CI")
    (remote / "README.md").write_text("hello\n")
    g("add", "-A")
    g("commit", "-q", "-m", "initial")
    tree, main_sha = g("rev-parse", "HEAD^{tree}"), g("rev-parse", "HEAD")
    n_faults = 40  # PRs reserved for the fault phases
    heads: dict[int, tuple[str, str]] = {}
    refs = []
    for n in range(1, args.prs + n_faults + 2):
        msg1, msg2 = f"pr {n} first", f"pr {n} second" + (" block" if n == args.prs + n_faults + 1 else "")
        c1 = g("commit-tree", tree, "-p", main_sha, "-m", msg1)
        c2 = g("commit-tree", tree, "-p", c1, "-m", msg2)
        heads[n] = (c1, c2)
        refs.append(f"update refs/heads/pr-{n} {c2}\n")
    g("update-ref", "--stdin", input="".join(refs))

    github = cleanup["github"] = FakeGitHub(app_id=29310, public_key_pem=public, installation_id=1).start()
    repo = github.add_repo("Codertocat", "Hello-World", remote)
    repo.permissions.update({"codertocat": "admin"})

    def localize(value: str) -> str:
        return (value.replace("@redis:6379/0", f"@127.0.0.1:{rds.port}/0")
                .replace("postgresql+psycopg2://tokengate:unused@postgres:5432/tokengate", pg.url)
                .replace("/run/secrets/github_app_key", str(work / "secrets" / "key.pem")))

    knobs = {"TOKENGATE_ENVIRONMENT": "test", "TOKENGATE_GITHUB_API_URL": github.base_url,
             "TOKENGATE_GITHUB_SECONDS_BETWEEN_REQUESTS": "0", "TOKENGATE_GITHUB_SECONDS_BETWEEN_WRITES": "0"}
    stack = cleanup["stack"] = NativeStack(work / "stack", app_env=env, localize=localize,
                                           bot_extra_env=knobs).supervise()  # compose's restart: policy
    mig = stack.run_once("migrate", timeout=120)
    assert mig.returncode == 0, mig.stderr
    port = free_port()
    stack.start("web", replace={"--host": "127.0.0.1", "--port": str(port)}, extra=("--log-level", "warning"))
    publish = stack.start("publish-worker", extra=("--beat-schedule", str(work / "beat")))
    gpu_extra = ("--include", "bot.testing.fake_gpu_tasks")
    gpu = stack.start("gpu-worker-0", extra=gpu_extra)
    for p in (publish, gpu):
        stack.wait_for_log(p, " ready.", timeout=90)
    url = f"http://127.0.0.1:{port}"
    wait(lambda: _ok(httpx, f"{url}/readyz"), 60, "web ready")
    engine = create_engine(pg.url, pool_pre_ping=True)
    out: dict = {"services_up_s": round(time.monotonic() - t_start, 1)}

    def q(sql: str, **kw):
        with engine.connect() as c:
            return c.execute(text(sql), kw).all()

    def payload(n: int, action: str, updated: datetime) -> dict:
        pr = repo.pulls.setdefault(n, PullState(number=n, title=f"PR {n}", author="Codertocat", head_ref=f"pr-{n}",
                                                base_ref="main"))
        body = github._urls(github._pull_json(repo, pr))
        body["head"]["sha"] = heads[n][0] if action == "opened" else heads[n][1]
        body["updated_at"] = iso(updated)
        return {"action": action, "number": n, "pull_request": body,
                "repository": github._urls(github._repo_json(repo)), "installation": {"id": 1},
                "sender": github._user("Codertocat")}

    local = threading.local()

    def post(event: str, body_obj: dict, delivery: str | None = None) -> tuple[float, int, str]:
        client = getattr(local, "c", None)
        if client is None:
            client = local.c = httpx.Client(base_url=url, timeout=15)
        body = json.dumps(body_obj).encode()
        d = delivery or str(uuid.uuid4())
        headers = {"Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Delivery": d,
                   "X-Hub-Signature-256": sign(webhook_secret, body)}
        t = time.perf_counter()
        try:
            code = client.post("/webhook", content=body, headers=headers).status_code
        except httpx.HTTPError:
            code = 0
        return time.perf_counter() - t, code, d

    def processed(ids) -> int:
        rows = q("SELECT count(*) FROM deliveries WHERE processed_at IS NOT NULL AND id = ANY(:ids)", ids=list(ids))
        return rows[0][0]

    def settle(ids, timeout: float, what: str) -> float:
        t = time.monotonic()
        try:
            wait(lambda: processed(ids) == len(ids), timeout, what, interval=0.5)
        except TimeoutError:
            pass
        return time.monotonic() - t

    def sticky_count(n: int) -> int:
        return sum(1 for c in github.comments_on(repo, n) if c["body"].startswith("<!-- tokengate"))

    # ---- burst --------------------------------------------------------------------------------------
    t0 = datetime.now(timezone.utc) - timedelta(minutes=5)
    jobs = []
    for n in range(1, args.prs + 1):
        # Half with GitHub's later updated_at on the push, half with the same second (ancestry decides).
        jobs.append(("opened", n, t0))
        jobs.append(("synchronize", n, t0 + timedelta(seconds=1 if n % 2 else 0)))
    random.Random(15).shuffle(jobs)
    bodies = [payload(n, a, t) for a, n, t in jobs]
    # The burst's clients run in a process of their own (scripts/burst_client.py: prepared bytes over raw
    # keep-alive sockets): this one also serves the test GitHub API, and sharing its GIL — or httpx's ~1 ms
    # of Python per request on these 2 cores — would add client work to every measured answer time.
    reqs = []
    for b in bodies:
        raw = json.dumps(b)
        reqs.append({"body": raw, "delivery": str(uuid.uuid4()), "sig": sign(webhook_secret, raw.encode())})
    (work / "burst.json").write_text(json.dumps(reqs))
    t_burst = time.perf_counter()
    client = subprocess.run([sys.executable, str(ROOT / "scripts" / "burst_client.py"), url, str(work / "burst.json"),
                             str(args.concurrency)], capture_output=True, text=True, timeout=600)
    burst_wall = time.perf_counter() - t_burst
    assert client.returncode == 0, client.stderr[-3000:]
    results = [tuple(r) for r in json.loads(client.stdout)]
    times = sorted(r[0] * 1000 for r in results)
    ids = [r[2] for r in results if r[1] == 202]
    settle_s = settle(ids, 900 - (time.monotonic() - t_start), "burst processed")

    def pct(p):
        return round(times[min(len(times) - 1, int(round(p * (len(times) - 1))))], 1)
    wait(lambda: not q("SELECT 1 FROM evaluations WHERE state IN ('queued','running') LIMIT 1"), 600,
         "burst evaluations finished", interval=1)
    evs = q("SELECT p.number, e.head_sha, e.state FROM evaluations e JOIN pull_requests p ON p.id = e.pull_request_id")
    prs = {r.number: r.head_sha for r in q("SELECT number, head_sha FROM pull_requests")}
    done_by_head: dict[tuple[int, str], int] = {}
    for r in evs:
        if r.state == "done":
            done_by_head[(r.number, r.head_sha)] = done_by_head.get((r.number, r.head_sha), 0) + 1
    old_head = [n for n in range(1, args.prs + 1)
                if prs.get(n) != heads[n][1] or (n, heads[n][1]) not in done_by_head
                or heads[n][1][:7] not in "".join(c["body"] for c in github.comments_on(repo, n))]
    out["burst"] = {
        "deliveries": len(bodies), "codes": {str(c): sum(1 for r in results if r[1] == c) for c in {r[1] for r in results}},
        "answer_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": round(times[-1], 1),
                      "mean": round(statistics.mean(times), 1)},
        "throughput_per_s": round(len(bodies) / burst_wall, 1),
        "all_processed_after_s": round(settle_s, 1),
        "dropped": len(bodies) - processed(ids),
        "duplicated_evaluations": sum(v - 1 for v in done_by_head.values() if v > 1),
        "duplicate_sticky_comments": sum(max(0, sticky_count(n) - 1) for n in range(1, args.prs + 1)),
        "prs_on_old_head": len(old_head),
    }
    print("burst:", json.dumps(out["burst"]), flush=True)
    base = args.prs

    def fresh(k: int) -> list[int]:
        nonlocal base
        ns = list(range(base + 1, base + 1 + k))
        base += k
        return ns

    def faults_result(ns, accepted, answered, extra=None) -> dict:
        r = {"deliveries": len(answered), "answered": {str(c): sum(1 for a in answered if a == c)
                                                         for c in set(answered)},
             "lost": len(accepted) - processed(accepted),
             "duplicate_sticky_comments": sum(max(0, sticky_count(n) - 1) for n in ns),
             "prs_without_comment": sum(1 for n in ns if sticky_count(n) == 0)}
        r.update(extra or {})
        return r

    now = datetime.now(timezone.utc)
    # ---- redis restart ------------------------------------------------------------------------------
    ns = fresh(8)
    before = [post("pull_request", payload(n, "synchronize", now)) for n in ns[:4]]
    rds.stop()  # SIGKILL: nothing saved; the queued messages are gone
    during = [post("pull_request", payload(n, "synchronize", now)) for n in ns[4:]]
    t = time.monotonic()
    rds.start()
    accepted = [r[2] for r in before + during]  # 503s are stored too (durable before answered)
    rec = settle(accepted, 120, "after the redis restart")
    wait(lambda: all(sticky_count(n) for n in ns), 60, "redis-phase comments", interval=0.5) \
        if processed(accepted) == len(accepted) else None
    out["redis_restart"] = faults_result(ns, accepted, [r[1] for r in before + during],
                                         {"stored_503_included": True,
                                          "all_processed_s_after_restart": round(time.monotonic() - t, 1)})
    print("redis:", json.dumps(out["redis_restart"]), flush=True)

    # ---- postgres restart ---------------------------------------------------------------------------
    ns = fresh(8)
    restarter = threading.Thread(target=lambda: pg.ctl("restart", "-m", "fast"))
    first = [post("pull_request", payload(n, "synchronize", now)) for n in ns[:4]]
    restarter.start()
    second = []
    for n in ns[4:]:
        second.append(post("pull_request", payload(n, "synchronize", now)))
        time.sleep(0.2)
    restarter.join()
    answered = first + second
    redelivered = 0
    for (took, code, d), n in zip(answered, ns):
        if code != 202:  # GitHub's redelivery of a failed delivery (same id, same body)
            redelivered += 1
            wait(lambda: post("pull_request", payload(n, "synchronize", now), d)[1] in (200, 202), 60,
                 "redelivery accepted", interval=1)
    accepted = [r[2] for r in answered]
    settle(accepted, 120, "after the postgres restart")
    out["postgres_restart"] = faults_result(ns, accepted, [r[1] for r in answered],
                                            {"redelivered_after_503": redelivered})
    print("postgres:", json.dumps(out["postgres_restart"]), flush=True)

    # ---- GitHub 503 for 60 s, then connection resets --------------------------------------------------
    ns = fresh(6)
    github.outage(args.outage_s)
    t = time.monotonic()
    answered = [post("pull_request", payload(n, "synchronize", now)) for n in ns]
    accepted = [r[2] for r in answered if r[1] == 202]
    settle(accepted, args.outage_s + 240, "after the GitHub outage")
    wait(lambda: all(sticky_count(n) for n in ns), 60, "outage-phase comments", interval=0.5) \
        if processed(accepted) == len(accepted) else None
    out["github_503"] = faults_result(ns, accepted, [r[1] for r in answered],
                                      {"outage_s": args.outage_s, "served_503": github.outages_served,
                                       "all_processed_s": round(time.monotonic() - t, 1)})
    print("github 503:", json.dumps(out["github_503"]), flush=True)

    ns = fresh(6)
    github.resets = 12
    answered = [post("pull_request", payload(n, "synchronize", now)) for n in ns]
    accepted = [r[2] for r in answered if r[1] == 202]
    settle(accepted, 180, "after the connection resets")
    wait(lambda: all(sticky_count(n) for n in ns), 60, "reset-phase comments", interval=0.5) \
        if processed(accepted) == len(accepted) else None
    out["connection_resets"] = faults_result(ns, accepted, [r[1] for r in answered],
                                             {"resets_done": github.resets_done})
    print("resets:", json.dumps(out["connection_resets"]), flush=True)

    # ---- kill -9 of the GPU worker mid-evaluation ---------------------------------------------------------
    n = args.prs + n_faults + 1  # its head commit blocks in the fake evaluation until released
    d = post("pull_request", payload(n, "synchronize", now))[2]
    settle([d], 60, "blocking PR handled")
    wait(lambda: q("SELECT 1 FROM evaluations e JOIN pull_requests p ON p.id=e.pull_request_id "
                   "WHERE p.number=:n AND e.state='running'", n=n), 60, "evaluation running", interval=0.2)
    time.sleep(2.0)  # well inside the evaluation
    t_kill = time.monotonic()
    stack.kill(gpu)
    stack.start("gpu-worker-0", extra=gpu_extra)
    row = wait(lambda: q("SELECT e.id, e.attempt, e.infra_kind FROM evaluations e JOIN pull_requests p "
                         "ON p.id=e.pull_request_id WHERE p.number=:n AND e.attempt >= 2", n=n), 120,
               "watchdog re-dispatch", interval=0.2)
    detected = time.monotonic() - t_kill
    import redis as redis_lib
    redis_lib.Redis(port=rds.port, username="web", password=env["REDIS_WEB_PASSWORD"]).set(
        f"tokengate:result:release:{heads[n][1]}", 1, ex=300)
    wait(lambda: q("SELECT 1 FROM evaluations e JOIN pull_requests p ON p.id=e.pull_request_id "
                   "WHERE p.number=:n AND e.state='done'", n=n), 120, "retried evaluation done", interval=0.2)
    out["gpu_worker_kill"] = {"recovered_s": round(detected, 1), "done_s": round(time.monotonic() - t_kill, 1),
                              "attempt": row[0].attempt, "infra_kind": row[0].infra_kind,
                              "defaults": "production (watchdog 5 s, lost after 15 s, heartbeat ttl 15 s)"}
    print("gpu kill:", json.dumps(out["gpu_worker_kill"]), flush=True)
    failed = q("SELECT count(*) FROM deliveries WHERE failed_at IS NOT NULL")[0][0]
    out["deliveries_given_up"] = failed
    # Crashed processes compose's `restart: unless-stopped` would have brought back (the drill does the same).
    out["service_restarts"] = [f"{name} (exit {code})" for name, code in stack.restarts]
    b = out["burst"]
    out["pass"] = bool(
        b["answer_ms"]["p99"] <= 50 and b["dropped"] == 0 and b["duplicated_evaluations"] == 0
        and b["duplicate_sticky_comments"] == 0 and b["prs_on_old_head"] == 0
        and all(out[k]["lost"] == 0 and out[k]["duplicate_sticky_comments"] == 0
                for k in ("redis_restart", "postgres_restart", "github_503", "connection_resets"))
        and out["gpu_worker_kill"]["recovered_s"] <= 30 and failed == 0)
    engine.dispose()
    return out


def _ok(httpx, url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
