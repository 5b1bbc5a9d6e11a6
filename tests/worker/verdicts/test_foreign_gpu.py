"""A foreign process on the GPU (as NVML reports it) is INFRA, never a measurement."""
import subprocess

import pytest

from worker import telemetry
from worker.calibration.aa_store import AAStore
from worker.pipeline import Job, evaluate
from worker.records import InfraKind, Verdict

from tests.worker.helpers import GOOD, fake_model, make_profile, make_repo, make_settings


class StubNvml:
    """Stands in for the GPU's NVML (there is no GPU on CI): reports one stranger's compute process."""

    ok, reason = True, None

    def __init__(self, pids):
        self.pids = pids

    def compute_pids(self):
        return self.pids

    def process_memory(self, pids):
        return None

    def device(self):
        return {"name": "Stub GPU", "driver": "0", "memory_total_bytes": None, "uuid": None}

    def sample(self):
        return {"energy_mj": None}


@pytest.mark.sandbox
def test_foreign_gpu_process_is_infra(tmp_path, cache, monkeypatch):
    stranger = subprocess.Popen(["sleep", "60"])  # a real process that is not ours
    monkeypatch.setattr(telemetry, "nvml", lambda index=0: StubNvml([stranger.pid]))
    repo = make_repo(tmp_path)
    p = make_profile(fake_model(tmp_path / "m.gguf"), device="cuda", memory_limit_bytes=None, pairs=2, inner=1,
                     warmup=0, prompts_per_seed=1)
    r = evaluate(Job(repo=str(repo), base_ref="main", head_ref="pr", profile="test"), make_settings(p),
                 trusted_root=GOOD, store=AAStore(tmp_path / "aa.sqlite"))
    assert r.verdict == Verdict.INFRA and r.infra_kind == InfraKind.FOREIGN_GPU_PROCESS, r.summary
    stranger.kill()
    stranger.wait()
    assert str(stranger.pid) in r.infra_detail
