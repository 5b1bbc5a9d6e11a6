"""The box-wide lock behind clones and `device_lock`: a second holder waits, a dead holder frees it."""
import multiprocessing as mp
import os
import signal
import time

from worker.paths import locked
from worker.queue.tasks import device_lock


def _hold(path, ready, release):
    with locked(path):
        ready.set()
        release.wait(30)


def _holder(path):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(path, ready, release), daemon=True)
    p.start()
    assert ready.wait(10)
    return p, release


def _acquired_within(path, seconds: float) -> bool:
    ctx = mp.get_context("fork")
    done = ctx.Event()
    p = ctx.Process(target=lambda: (locked(path).__enter__(), done.set()), daemon=True)
    p.start()
    got = done.wait(seconds)
    p.kill()
    p.join()
    return got


def test_a_second_holder_waits_until_the_first_releases(tmp_path):
    path = tmp_path / "locks" / "x.lock"
    holder, release = _holder(path)
    assert not _acquired_within(path, 0.5)
    release.set()
    holder.join(10)
    assert _acquired_within(path, 5)


def test_a_holder_that_dies_frees_the_lock(tmp_path):
    path = tmp_path / "x.lock"
    holder, _ = _holder(path)
    os.kill(holder.pid, signal.SIGKILL)  # a worker killed mid-evaluation must not wedge the device
    holder.join(10)
    t0 = time.monotonic()
    assert _acquired_within(path, 5)
    assert time.monotonic() - t0 < 5


def test_devices_of_one_box_are_locked_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENGATE_CACHE_DIR", str(tmp_path))
    with device_lock("cuda:0"):
        with device_lock("cuda:1"):  # would block forever if both devices shared one lock
            pass
    assert {p.name for p in (tmp_path / "locks").iterdir()} == {"cuda_0.lock", "cuda_1.lock"}
