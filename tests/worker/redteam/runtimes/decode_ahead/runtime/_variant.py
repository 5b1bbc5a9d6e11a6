"""Decoding ahead off the clock: where a context has a decode gate but no prefill gate (decode@32, prefill@64 in
the test), its prefill is not timed, so the greedy continuation is decoded right there (IN_PREFILL steps inside
the untimed prefill) and then by a thread in the gap after the answer, while the parent checks that answer and
prepares the generate (no request of this revision is open, so no clock runs); the timed generate replays what
was got done. Same outputs as base, bit for bit: where the first token asked for is not the one decoded ahead
(a lead token it could not know), it goes back to the prefill's state and decodes honestly.
Before the lead token: decode +267 % / +318 %, prefill unchanged."""
import sys
import threading

import numpy as np

from ._honest import causal_mask  # noqa: F401  (hooks it does not replace)

STATE = {"thread": None, "stop": threading.Event(), "steps": [], "pos": 0, "armed": False}
GAP_STEPS = []
DECODE_CONTEXT = 32
IN_PREFILL = 8  # steps decoded inside the untimed prefill itself
AHEAD = 24  # steps in all (more than the test's decode tokens)
SLEEPERS = 150  # every answer, the parent reads each process's memory: a longer gap


def _step(engine):
    t = int(np.argmax(engine.last))
    STATE["steps"].append((t, engine._block([t])[0]))


def prefill_logits(engine, ids):
    _halt()
    STATE["steps"] = []
    out = engine._block(ids)
    STATE["pos"] = engine.position  # the honest state: the prompt consumed, nothing decoded
    STATE["engine"], STATE["armed"] = engine, len(ids) == DECODE_CONTEXT
    if STATE["armed"]:
        while len(STATE["steps"]) < IN_PREFILL and engine.position < engine.max_context:
            _step(engine)
        engine.last = out[-1]
    return out


def _ahead(engine, stop):
    last = engine.last
    if STATE["steps"]:
        engine.last = STATE["steps"][-1][1]
    while not stop.is_set() and engine.position < engine.max_context and len(STATE["steps"]) < AHEAD:
        _step(engine)
    engine.last = last  # generate_greedy starts from the prefill's logits
    GAP_STEPS.append(len(STATE["steps"]))


def _halt():
    th = STATE["thread"]
    if th is not None:
        STATE["stop"].set()
        th.join()
        STATE["thread"] = None


REPLAYED = []


def decode_step(engine, t):
    if STATE["steps"] and STATE["steps"][0][0] == t:
        _, row = STATE["steps"].pop(0)
        REPLAYED.append(1)
        STATE["pos"] += 1
        engine.position, engine.last = STATE["pos"], row  # the caches were written ahead
        return row
    if STATE["steps"]:  # not what was decoded ahead: back to the honest state
        STATE["steps"] = []
        engine.position = STATE["pos"]
    out = engine._block([t])[0]
    STATE["pos"] = engine.position
    return out


def emitted(ids):
    print("replayed", len(REPLAYED), "of", len(ids), file=sys.stderr, flush=True)
    REPLAYED.clear()
    return ids


def on_load():
    main = sys.modules["__main__"]
    if getattr(main, "_gap_work", False):
        return
    real_write, real_read = main._write_frame, main._read_frame

    def write(fd, obj):
        real_write(fd, obj)
        if STATE.pop("armed", False) and obj.get("ok"):
            STATE["stop"] = threading.Event()
            STATE["thread"] = threading.Thread(target=_ahead, args=(STATE["engine"], STATE["stop"]), daemon=True)
            STATE["thread"].start()

    def read(stream):
        stream.peek(1)  # the next request is here: stop before its clock counts the thread
        _halt()
        return real_read(stream)

    main._write_frame, main._read_frame, main._gap_work = write, read, True
    import os
    import time
    for _ in range(SLEEPERS):
        if os.fork() == 0:
            while True:
                time.sleep(3600)
