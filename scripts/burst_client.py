"""A lean load generator for POST /webhook bursts: N prepared requests over `concurrency` keep-alive
connections, each answer timed from the first byte sent to the last byte of the answer read.

    python scripts/burst_client.py URL REQUESTS.json CONCURRENCY   # prints [[seconds, status, delivery], ...]

REQUESTS.json: [{"body": str, "delivery": str, "sig": str, "event": str (default pull_request)}, ...].

Why not httpx: on a 2-core box the client shares the CPU with the server it measures; httpx spends ~1 ms of
Python per request (and 32 threads of it contend for one GIL), which lands in the very answer times being
measured. Here every request's bytes are built before the clock starts and an answer is read with a few
socket calls, so what is timed is the server's answer.
"""
from __future__ import annotations

import gc
import json
import socket
import sys
import threading
import time
from urllib.parse import urlsplit


def request_bytes(host: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST /webhook HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
             *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def read_answer(sock: socket.socket, buf: bytearray) -> int:
    """Read one HTTP/1.1 answer (Content-Length framed) off `sock`; its status code. `buf` keeps leftovers."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    total = len(head) + 4 + length
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    del buf[:total]
    return status


def burst(url: str, prepared: list[tuple[bytes, str]], concurrency: int) -> list[list]:
    """Send every (request bytes, delivery id) over `concurrency` connections; [[seconds, status, delivery]]."""
    parts = urlsplit(url)
    addr = (parts.hostname, parts.port or 80)
    results: list[list | None] = [None] * len(prepared)
    next_index = iter(range(len(prepared)))
    lock = threading.Lock()
    socks = [socket.create_connection(addr) for _ in range(concurrency)]  # connected before the clock starts
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def worker(sock: socket.socket) -> None:
        buf = bytearray()
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            data, delivery = prepared[i]
            t = time.perf_counter()
            try:
                sock.sendall(data)
                status = read_answer(sock, buf)
            except OSError:
                status = 0
                sock.close()
                sock = socket.create_connection(addr)
                buf.clear()
            results[i] = [time.perf_counter() - t, status, delivery]

    threads = [threading.Thread(target=worker, args=(s,)) for s in socks]
    gc.collect()
    gc.disable()  # a collection here would stall every client thread at once and be timed as the server's
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        gc.enable()
    for s in socks:
        s.close()
    return results


def prepare(url: str, reqs: list[dict]) -> list[tuple[bytes, str]]:
    host = urlsplit(url).netloc
    return [(request_bytes(host, r["body"].encode(), {
        "Content-Type": "application/json", "X-GitHub-Event": r.get("event", "pull_request"),
        "X-GitHub-Delivery": r["delivery"], "X-Hub-Signature-256": r["sig"]}), r["delivery"]) for r in reqs]


def main(argv: list[str]) -> int:
    url, path, concurrency = argv[0], argv[1], int(argv[2])
    with open(path) as f:
        prepared = prepare(url, json.load(f))
    print(json.dumps(burst(url, prepared, concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
