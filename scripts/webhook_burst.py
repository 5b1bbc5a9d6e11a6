"""Webhook answer time under a burst of signed deliveries (real uvicorn, real PostgreSQL, real Redis).

    python scripts/webhook_burst.py [--n 500] [--concurrency 16] [--database postgresql|sqlite]

Creates a throwaway database and Redis key prefix, migrates, starts `tokengate`'s web app under
uvicorn on 127.0.0.1, fires N deliveries of GitHub's pull_request.opened body (27 KB, each with its
own X-GitHub-Delivery, correctly signed) from `concurrency` client threads, and prints p50/p90/p99
of the client-observed answer time. Nothing consumes the queue; everything is removed afterwards.
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import tempfile
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# a GitHub example payload copied into the test fixtures
PAYLOAD = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "github" / "payloads" / "pull_request.opened.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    args = ap.parse_args()

    import httpx
    import psycopg2
    import redis

    from bot.db import migrate
    from bot.github.signature import sign

    secret = secrets.token_hex(16)
    prefix = f"tokengate-burst-{secrets.token_hex(4)}:"
    dbname = f"tokengate_burst_{secrets.token_hex(4)}"
    tmp = tempfile.TemporaryDirectory()
    if args.database == "postgresql":
        admin = psycopg2.connect(host="127.0.0.1", user="postgres", dbname="postgres")
        admin.autocommit = True
        admin.cursor().execute(f'CREATE DATABASE "{dbname}"')
        url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{dbname}"
    else:
        url = f"sqlite:///{tmp.name}/burst.sqlite3"
    migrate.upgrade(url)
    # The web app runs as its own process (`tokengate serve`), as in production: the client threads here
    # do not compete with it for the GIL.
    port = free_port()
    env = {**os.environ, "TOKENGATE_ENVIRONMENT": "test", "TOKENGATE_DATABASE_URL": url,
           "TOKENGATE_BROKER_URL": "redis://127.0.0.1:6379/13", "TOKENGATE_REDIS_KEY_PREFIX": prefix,
           "TOKENGATE_WEBHOOK_SECRET": secret, "TOKENGATE_APP_ID": "1",
           "TOKENGATE_PRIVATE_KEY": "unused: the web app never calls GitHub"}
    root = Path(__file__).resolve().parents[1]
    server = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=root)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    else:
        server.kill()
        raise SystemExit("web app did not start")

    body = PAYLOAD.read_bytes()
    signature = sign(secret, body)
    local = threading.local()

    def one(_i: int) -> tuple[float, int]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "pull_request",
                   "X-GitHub-Delivery": str(uuid.uuid4()), "X-Hub-Signature-256": signature}
        t = time.perf_counter()
        r = client.post("/webhook", content=body, headers=headers)
        return time.perf_counter() - t, r.status_code

    for i in range(20):  # warm-up (connections, first queries), not counted
        one(i)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(one, range(args.n)))
    wall = time.perf_counter() - t0
    server.terminate()
    server.wait(10)

    times = sorted(t * 1000 for t, _ in results)
    codes = {c: sum(1 for _, k in results if k == c) for c in {k for _, k in results}}

    def q(p: float) -> float:
        return times[min(len(times) - 1, int(round(p * (len(times) - 1))))]

    print(f"webhook burst: {args.n} signed deliveries ({len(body)} B each), {args.concurrency} concurrent clients, "
          f"{args.database}, {os.cpu_count()} CPUs")
    print(f"  status codes: {codes}")
    print(f"  answer time ms: p50 {q(0.50):.1f}  p90 {q(0.90):.1f}  p99 {q(0.99):.1f}  max {times[-1]:.1f}  "
          f"mean {statistics.mean(times):.1f}")
    print(f"  throughput: {args.n / wall:.0f} deliveries/s")

    r = redis.Redis.from_url("redis://127.0.0.1:6379/13")
    for key in r.scan_iter(match=f"{prefix}*", count=1000):
        r.delete(key)
    from bot.db.engine import engine_for
    engine_for(url).dispose()
    if args.database == "postgresql":
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
    tmp.cleanup()
    return 0 if set(codes) == {202} else 1


if __name__ == "__main__":
    sys.exit(main())
