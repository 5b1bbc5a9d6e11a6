"""Webhook answer time under a burst of signed deliveries (real uvicorn, real PostgreSQL, real Redis).

    python scripts/webhook_burst.py [--n 500] [--concurrency 32] [--database postgresql|sqlite] [--client lean|httpx]
                                    [--workers 1]

Creates a throwaway database and Redis key prefix, migrates, starts `tokengate`'s web app under
uvicorn on 127.0.0.1, fires N deliveries of GitHub's pull_request.opened body (~25 KB, each its own
PR number and X-GitHub-Delivery, correctly signed) over `concurrency` keep-alive connections, and prints
p50/p90/p99 of the client-observed answer time and the load average. Nothing consumes the queue;
everything is removed afterwards.
"""
from __future__ import annotations

import argparse
import json
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
import burst_client  # noqa: E402  (scripts/burst_client.py)

# a GitHub example payload copied into the test fixtures
PAYLOAD = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "github" / "payloads" / "pull_request.opened.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int | None = None) -> float:
    """User+system CPU of `pid` and its children (uvicorn's worker processes) — or, without a pid, of every
    PostgreSQL process on the box (others' work included)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        mine = int(entry) == pid or int(fields[1]) == pid if pid else name in ("postgres", "postmaster")
        if mine:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--client", choices=["lean", "httpx"], default="lean",
                    help="lean: scripts/burst_client.py (prepared bytes, raw sockets); httpx: 32 httpx threads")
    ap.add_argument("--workers", type=int, default=1, help="serve --workers")
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
                               "--log-level", "warning", *(["--workers", str(args.workers)] if args.workers > 1 else [])],
                              env=env, cwd=root)
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

    # One distinct body per delivery (its PR number): the same body under a new delivery id is a replay,
    # answered by the duplicate path, not the insert measured here. Signed before the clock starts.
    template = json.loads(PAYLOAD.read_bytes())
    requests = []
    for i in range(args.n + 20):
        template["number"] = template["pull_request"]["number"] = 1000 + i
        body = json.dumps(template).encode()
        requests.append((body, sign(secret, body), str(uuid.uuid4())))
    local = threading.local()

    def one(i: int) -> tuple[float, int]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        body, signature, delivery = requests[i]
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "pull_request",
                   "X-GitHub-Delivery": delivery, "X-Hub-Signature-256": signature}
        t = time.perf_counter()
        r = client.post("/webhook", content=body, headers=headers)
        return time.perf_counter() - t, r.status_code

    for i in range(args.n, args.n + 20):  # warm-up (connections, first queries), not counted
        one(i)
    cpu0 = cpu_seconds(server.pid), cpu_seconds(), time.process_time()
    t0 = time.perf_counter()
    if args.client == "httpx":
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, range(args.n)))
    else:
        base = f"http://127.0.0.1:{port}"
        prepared = burst_client.prepare(base, [{"body": b.decode(), "sig": sig, "delivery": d}
                                               for b, sig, d in requests[:args.n]])
        t0 = time.perf_counter()
        results = [(t, code) for t, code, _ in burst_client.burst(base, prepared, args.concurrency)]
    wall = time.perf_counter() - t0
    cpu = [(after - before) * 1000 / args.n
           for before, after in zip(cpu0, (cpu_seconds(server.pid), cpu_seconds(), time.process_time()))]
    server.terminate()
    server.wait(10)

    times = sorted(t * 1000 for t, _ in results)
    codes = {c: sum(1 for _, k in results if k == c) for c in {k for _, k in results}}

    def q(p: float) -> float:
        return times[min(len(times) - 1, int(round(p * (len(times) - 1))))]

    print(f"webhook burst: {args.n} signed deliveries ({len(requests[0][0])} B each), {args.concurrency} concurrent clients, "
          f"{args.database}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"  status codes: {codes}")
    print(f"  answer time ms: p50 {q(0.50):.1f}  p90 {q(0.90):.1f}  p99 {q(0.99):.1f}  max {times[-1]:.1f}  "
          f"mean {statistics.mean(times):.1f}")
    print(f"  throughput: {args.n / wall:.0f} deliveries/s")
    print(f"  CPU ms per delivery: web app {cpu[0]:.2f} (all its processes), PostgreSQL {cpu[1]:.2f} (every "
          f"backend on the box), client {cpu[2]:.2f}")

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
