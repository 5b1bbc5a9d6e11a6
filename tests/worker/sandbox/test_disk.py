"""The disk cap's measuring and the compile caches' pruning (the end-to-end attack: redteam cache_fill)."""
import os
import time

from worker import compile_cache
from worker.sandbox.disk import DiskWatch, usage


def _fill(d, n, size=1 << 16):
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"f{i}").write_bytes(os.urandom(size))


def test_usage_counts_allocated_bytes_and_follows_no_link(tmp_path):
    _fill(tmp_path / "cache" / "sub", 4)
    _fill(tmp_path / "host", 64)
    (tmp_path / "cache" / "link").symlink_to(tmp_path / "host")  # the host's files are not its writes
    u = usage(tmp_path / "cache", 1000)
    assert 4 * (1 << 16) <= u.bytes < 64 * (1 << 16) and u.entries == 6


def test_usage_stops_counting_past_the_entry_cap(tmp_path):
    _fill(tmp_path / "c", 50, size=1)
    assert usage(tmp_path / "c", 10).entries == 11  # enough to see the breach, no more walking


def test_the_watch_calls_its_breach_once_over_the_cap(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    fired = []
    w = DiskWatch([d], max_bytes=1 << 20, max_entries=1000, on_breach=lambda: fired.append(1), interval=0.05)
    w.start()
    time.sleep(0.2)
    assert not fired and w.breach is None
    _fill(d, 40)  # 2.5 MiB
    deadline = time.monotonic() + 5
    while not fired and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fired == [1] and "over its cap" in w.stop()


def test_the_least_recently_used_caches_go_first_and_never_the_one_in_use(tmp_path):
    root = tmp_path / "compile"
    for age, name in enumerate(["old", "mid", "new"]):
        _fill(root / name, 16)  # 1 MiB each
        os.utime(root / name, (1000 + age, 1000 + age))
    assert compile_cache.prune(root, keep=root / "old", max_total=(3 << 20) - 1) == ["mid"]
    assert sorted(p.name for p in root.iterdir()) == ["new", "old"]
    assert compile_cache.prune(root, keep=root / "new", max_total=3 << 20) == []
