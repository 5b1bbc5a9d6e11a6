"""A revision that runs as host uid 65534 owns its writable directories (its SHA's compile cache)."""
import os

import pytest

from worker.sandbox import bwrap
from worker.sandbox.process import _hand_over


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_writable_tree_is_handed_to_the_sandbox_uid(tmp_path):
    d = tmp_path / "compile" / "abc123"
    (d / "triton" / "X").mkdir(parents=True)
    (d / "triton" / "X" / "k.cubin").write_bytes(b"\0")
    _hand_over([d], bwrap.SANDBOX_UID)
    for p in (d, d / "triton", d / "triton" / "X", d / "triton" / "X" / "k.cubin"):
        assert os.lstat(p).st_uid == bwrap.SANDBOX_UID
    assert os.lstat(tmp_path).st_uid == 0  # nothing above it


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_a_cache_made_under_65534_comes_back_to_root(tmp_path):
    d = tmp_path / "c"
    (d / "triton").mkdir(parents=True)
    _hand_over([d], bwrap.SANDBOX_UID)
    _hand_over([d], 0)
    assert os.lstat(d / "triton").st_uid == 0
