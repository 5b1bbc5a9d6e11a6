"""The parent's reader of the revision's answers (worker/harness/frames.py): a size cap checked before any
body is read, a deadline that a trickling or silent revision cannot stretch, and only JSON objects."""
import os
import time

import pytest

from worker.harness.frames import HEADER, FrameError, FrameReader, encode


@pytest.fixture
def pipe():
    r, w = os.pipe()
    yield FrameReader(r, max_bytes=1 << 10), w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_whole_frame_is_read(pipe):
    reader, w = pipe
    os.write(w, encode({"ok": 1}) + encode({"ok": 2}))
    assert reader.read(1) == {"ok": 1} and reader.read(1) == {"ok": 2}


def test_an_oversized_announcement_is_refused_before_its_body(pipe):
    reader, w = pipe
    os.write(w, HEADER.pack(1 << 30))  # no body follows: reading it would wait, then allocate 1 GiB
    t0 = time.monotonic()
    with pytest.raises(FrameError) as e:
        reader.read(5)
    assert e.value.kind == "oversized" and time.monotonic() - t0 < 1


def test_a_frame_that_never_completes_ends_at_the_deadline(pipe):
    reader, w = pipe
    os.write(w, HEADER.pack(100) + b'{"a"')
    t0 = time.monotonic()
    with pytest.raises(FrameError) as e:
        reader.read(0.3)
    assert e.value.kind == "timeout" and time.monotonic() - t0 < 2


@pytest.mark.parametrize("body", [b"[1, 2]", b"\xff\xfe", b"{not json"])
def test_only_a_json_object_is_an_answer(pipe, body):
    reader, w = pipe
    os.write(w, HEADER.pack(len(body)) + body)
    with pytest.raises(FrameError) as e:
        reader.read(1)
    assert e.value.kind == "unreadable"


def test_a_closed_channel_is_said(pipe):
    reader, w = pipe
    os.close(w)
    with pytest.raises(FrameError) as e:
        reader.read(1)
    assert e.value.kind == "closed"
