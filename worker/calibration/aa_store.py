"""A/A calibration records: per-gate speed deltas and per-seed guard scores of base vs base.

A small SQLite file (stdlib sqlite3) under the cache dir, keyed by the measuring host (device
fingerprint), profile and model. The noise floor of a gate and the guard floors are computed
from these rows; the bot's database is not involved (the GPU side holds no DB credentials).

`host` holds the calibration key (worker/calibration/key.py: GPU UUID + driver + torch/triton,
not the hostname). The file lives on a compose volume (`aa-history`), so a re-created worker
keeps its history; it is also the file `bench/worker/gpu_calibration.py` resumes from.

Speed rows are *process-pair* deltas (worker/gates/noise.py), also keyed by the measurement protocol
(reps, clock, tokens...): a floor is only valid for deltas measured the same way. The older
`gate_delta` table (one row per evaluation, no protocol) is left in place and no longer read.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from worker.paths import cache_dir

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gate_delta (
    host TEXT NOT NULL, profile TEXT NOT NULL, model TEXT NOT NULL, gate TEXT NOT NULL,
    delta REAL NOT NULL, sha TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS gate_delta_key ON gate_delta(host, profile, model, gate);
CREATE TABLE IF NOT EXISTS pair_delta (
    host TEXT NOT NULL, profile TEXT NOT NULL, protocol TEXT NOT NULL, model TEXT NOT NULL,
    gate TEXT NOT NULL, delta REAL NOT NULL, sha TEXT, created REAL NOT NULL, runtime TEXT);
CREATE INDEX IF NOT EXISTS pair_delta_key ON pair_delta(host, profile, protocol, model, gate);
CREATE TABLE IF NOT EXISTS guard_score (
    host TEXT NOT NULL, profile TEXT NOT NULL, model TEXT NOT NULL, seed INTEGER NOT NULL,
    top1 REAL NOT NULL, kl REAL NOT NULL, sha TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS guard_score_key ON guard_score(host, profile, model);
CREATE TABLE IF NOT EXISTS pair_epoch (
    host TEXT NOT NULL, profile TEXT NOT NULL, protocol TEXT NOT NULL, model TEXT NOT NULL,
    gate TEXT NOT NULL, since REAL NOT NULL, reason TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS guard_aa (
    guard_key TEXT NOT NULL, profile TEXT NOT NULL, seed INTEGER NOT NULL,
    base_top1 REAL NOT NULL, base_kl REAL NOT NULL, head_top1 REAL NOT NULL, head_kl REAL NOT NULL,
    sha TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS guard_aa_key ON guard_aa(guard_key, profile);
"""


class AAStore:
    def __init__(self, path: Path | str | None = None):
        env = os.environ.get("TOKENGATE_AA_HISTORY")  # the compose volume (docker-compose.yml)
        self.path = Path(path) if path else (Path(env) if env else cache_dir() / "aa.sqlite")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.executescript(_SCHEMA)
            # files made before main's runtime was recorded: their rows' runtime is NULL (unknown)
            if "runtime" not in {r[1] for r in db.execute("PRAGMA table_info(pair_delta)")}:
                db.execute("ALTER TABLE pair_delta ADD COLUMN runtime TEXT")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30)

    def add_pair_delta(self, host: str, profile: str, protocol: str, model: str, gate: str, delta: float,
                       sha: str | None = None, runtime: str | None = None):
        """One A/A process pair's log ratio (head/base) for one gate; `runtime`: the git tree id of the
        measured revision's runtime package (worker/calibration/runtime_change.py)."""
        self.add_pair_delta_at(host, profile, protocol, model, gate, delta, time.time(), sha, runtime)

    def pair_deltas(self, host: str, profile: str, protocol: str, model: str, gate: str,
                    limit: int = 400) -> list[float]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT delta FROM pair_delta WHERE host=? AND profile=? AND protocol=? AND model=? "
                              "AND gate=? ORDER BY created DESC LIMIT ?",
                              (host, profile, protocol, model, gate, limit)).fetchall()
        return [r[0] for r in rows]

    def add_pair_delta_at(self, host: str, profile: str, protocol: str, model: str, gate: str, delta: float,
                          created: float, sha: str | None = None, runtime: str | None = None):
        """Same, with an explicit timestamp (tests of expiry and drift)."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO pair_delta (host, profile, protocol, model, gate, delta, sha, created, runtime) "
                       "VALUES (?,?,?,?,?,?,?,?,?)",
                       (host, profile, protocol, model, gate, float(delta), sha, float(created), runtime))

    def pair_rows(self, host: str, profile: str, protocol: str, model: str, gate: str, since: float = 0.0,
                  limit: int = 400) -> list[tuple[float, float]]:
        """(delta, created) newest first, created >= since and after the gate's last epoch start."""
        return [(d, c) for d, c, _ in self.runtime_rows(host, profile, protocol, model, gate, since, limit)]

    def runtime_rows(self, host: str, profile: str, protocol: str, model: str, gate: str, since: float = 0.0,
                     limit: int = 400) -> list[tuple[float, float, str | None]]:
        """pair_rows with each row's runtime tree id (None: recorded before it was kept)."""
        since = max(since, self.epoch_start(host, profile, protocol, model, gate))
        with closing(self._connect()) as db:
            rows = db.execute("SELECT delta, created, runtime FROM pair_delta WHERE host=? AND profile=? AND "
                              "protocol=? AND model=? AND gate=? AND created>=? ORDER BY created DESC LIMIT ?",
                              (host, profile, protocol, model, gate, since, limit)).fetchall()
        return [(float(d), float(c), r) for d, c, r in rows]

    def gates(self, host: str, profile: str, protocol: str, model: str) -> list[str]:
        """Gates with A/A pair deltas of this model."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT DISTINCT gate FROM pair_delta WHERE host=? AND profile=? AND protocol=? "
                              "AND model=? ORDER BY gate", (host, profile, protocol, model)).fetchall()
        return [r[0] for r in rows]

    def epoch_start(self, host: str, profile: str, protocol: str, model: str, gate: str) -> float:
        with closing(self._connect()) as db:
            row = db.execute("SELECT MAX(since) FROM pair_epoch WHERE host=? AND profile=? AND protocol=? AND model=? "
                             "AND gate=?", (host, profile, protocol, model, gate)).fetchone()
        return float(row[0]) if row and row[0] is not None else 0.0

    def retire_before(self, host: str, profile: str, protocol: str, model: str, gate: str, since: float,
                      reason: str):
        """History older than `since` no longer counts for this gate (drift: the floor is rebuilt)."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO pair_epoch VALUES (?,?,?,?,?,?,?,?)",
                       (host, profile, protocol, model, gate, float(since), reason, time.time()))

    def add_guard_aa(self, guard_key: str, profile: str, seed: int, base: tuple[float, float],
                     head: tuple[float, float], sha: str | None = None):
        """One A/A seed score of both roles (top-1, KL): the guards' calibration."""
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO guard_aa VALUES (?,?,?,?,?,?,?,?,?)",
                       (guard_key, profile, int(seed), float(base[0]), float(base[1]), float(head[0]),
                        float(head[1]), sha, time.time()))

    def guard_aa(self, guard_key: str, profile: str, limit: int = 500) -> list[tuple[int, float, float, float, float]]:
        """(seed, base top-1, base KL, head top-1, head KL), newest first."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT seed, base_top1, base_kl, head_top1, head_kl FROM guard_aa WHERE guard_key=? "
                              "AND profile=? ORDER BY created DESC LIMIT ?", (guard_key, profile, limit)).fetchall()
        return [(int(r[0]), *map(float, r[1:])) for r in rows]

    def add_guard_score(self, host: str, profile: str, model: str, seed: int, top1: float, kl: float,
                        sha: str | None = None):
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO guard_score VALUES (?,?,?,?,?,?,?,?)",
                       (host, profile, model, int(seed), float(top1), float(kl), sha, time.time()))

    def guard_scores(self, host: str, profile: str, model: str, limit: int = 500) -> list[tuple[int, float, float]]:
        with closing(self._connect()) as db:
            rows = db.execute("SELECT seed, top1, kl FROM guard_score WHERE host=? AND profile=? AND model=? "
                              "ORDER BY created DESC LIMIT ?", (host, profile, model, limit)).fetchall()
        return [(int(s), float(t), float(k)) for s, t, k in rows]
