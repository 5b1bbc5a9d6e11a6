"""GPU receipt for the idle-kernel check (issue 14 item 3): what NVML's per-process samples show.

    python bench/worker/nvml_idle_probe.py --out bench/receipts

1. Sampling: a child keeps the GPU busy for 2 s, then idles; the parent polls
   nvmlDeviceGetProcessUtilization and records each distinct sample (pid, timestamp, SM %):
   the sampling period, whether timestamps are epoch microseconds, and how long after the child's
   last kernel a non-zero sample can still carry a timestamp (what `idle_gpu_settle_s` must cover).
2. Frozen with kernels queued: the child enqueues ~2 s of matmuls without synchronising, then is
   stopped (SIGSTOP, what cgroup.freeze does to its threads); the samples show whether its kernels
   keep the SMs busy while it is frozen (why the parent checks NVML and not the revision's word).
3. Idle after busy, read as the worker reads it: samples asked for with lastSeenTimeStamp = a moment
   after the child's last kernel (worker/telemetry.py process_utilization(since)). Polled with 0
   (steps 1-2), the H200's smUtil behaves as busy time over the time since the process began,
   decaying for seconds after the last kernel (nvml-idle-probe-20261202T174227Z.json); this step
   shows whether a `since` window reports that residue (it would void honest idle revisions) or not.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import sys, time, torch
mode, secs = sys.argv[1], float(sys.argv[2])
a = torch.randn(8192, 8192, device="cuda"); b = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
t0 = time.time(); n = 0
if mode == "busy":
    while time.time() - t0 < secs:
        a @ b; n += 1
        if n % 20 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize()
    print("END", time.time(), flush=True)
    time.sleep(3)
else:  # queue: time one matmul, then enqueue `secs` worth without synchronising
    s = time.time(); [a @ b for _ in range(10)]; torch.cuda.synchronize(); per = (time.time() - s) / 10
    for _ in range(int(secs / per)): a @ b
    print("QUEUED", time.time(), per, flush=True)
    time.sleep(30)
"""


def poll(nv, h, pid, seconds, since=None):
    """Distinct samples for `seconds`; `since` (epoch s): each call asks only for samples after it."""
    seen, out, t_end = set(), [], time.time() + seconds
    while time.time() < t_end:
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, int(since * 1e6) if since else 0)
        except nv.NVMLError as exc:
            samples = []
            if "Not Found" not in str(exc):
                out.append({"error": str(exc)})
        for s in samples:
            k = (s.pid, s.timeStamp)
            if k not in seen:
                seen.add(k)
                out.append({"pid": s.pid, "ts": s.timeStamp / 1e6, "sm": s.smUtil, "polled": time.time(),
                            "ours": s.pid == pid})
        time.sleep(0.01)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    rec = {"gpu": nv.nvmlDeviceGetName(h), "driver": nv.nvmlSystemGetDriverVersion(),
           "when": dt.datetime.now(dt.timezone.utc).isoformat()}

    p = subprocess.Popen([sys.executable, "-c", CHILD, "busy", "2"], stdout=subprocess.PIPE, text=True)
    t_start = time.time()
    samples = poll(nv, h, p.pid, 7)
    end = float(p.stdout.readline().split()[1])
    p.wait()
    mine = [s for s in samples if s.get("ours")]
    ts = sorted(s["ts"] for s in mine)
    busy = [s for s in mine if s["sm"] > 0]
    rec["sampling"] = {"child_pid": p.pid, "busy_end": end, "started": t_start, "samples": samples,
                       "intervals_s": [round(b - a, 4) for a, b in zip(ts, ts[1:])],
                       "last_busy_sample_after_end_s": (max(s["ts"] for s in busy) - end) if busy else None,
                       "ts_minus_poll_s": [round(s["ts"] - s["polled"], 4) for s in mine][:20]}

    p = subprocess.Popen([sys.executable, "-c", CHILD, "busy", "2"], stdout=subprocess.PIPE, text=True)
    end = float(p.stdout.readline().split()[1])  # its last kernel has finished; it sleeps 3 s now
    since = end + 0.05
    after = poll(nv, h, p.pid, 2.5, since=since)
    p.wait()
    rec["idle_after_busy_since"] = {
        "busy_end": end, "since": since, "samples": after,
        "nonzero_samples_of_idle_child": [s for s in after if s.get("ours") and s["sm"] > 0]}

    q = subprocess.Popen([sys.executable, "-c", CHILD, "queue", "2.5"], stdout=subprocess.PIPE, text=True)
    line = q.stdout.readline().split()
    os.kill(q.pid, signal.SIGSTOP)
    stopped = time.time()
    frozen = poll(nv, h, q.pid, 4)
    os.kill(q.pid, signal.SIGCONT)
    q.kill()
    q.wait()
    fz = [s for s in frozen if s.get("ours")]
    rec["frozen_with_queued_kernels"] = {
        "queued_at": float(line[1]), "per_matmul_s": float(line[2]), "stopped_at": stopped, "samples": frozen,
        "busy_samples_while_stopped": [s for s in fz if s["sm"] > 0 and s["ts"] > stopped + 0.2]}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"nvml-idle-probe-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(rec, indent=1))
    print(json.dumps({k: v for k, v in rec["sampling"].items() if k != "samples"}, indent=1))
    print("idle child, nonzero with since:", len(rec["idle_after_busy_since"]["nonzero_samples_of_idle_child"]))
    print("busy while stopped:", rec["frozen_with_queued_kernels"]["busy_samples_while_stopped"][:10])
    print(path)


if __name__ == "__main__":
    main()
