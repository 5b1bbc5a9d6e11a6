"""The key A/A history is stored under: what makes two workers' noise comparable.

GPU: the GPU's UUID (this very card, not its model or the container's hostname, which changes
whenever a worker is re-created), the driver, torch and triton. CPU: the CPU model and count and
torch. The measurement protocol (reps, clock, tokens...) is a separate column of every row. A
change of any part starts a new history, which the worker then records by itself
(worker/calibration/auto.py).
"""
from __future__ import annotations

import hashlib
import json
import os

from worker import telemetry


def key_facts(device: str) -> dict:
    v = telemetry._versions()
    facts = {"torch": v.get("torch"), "triton": v.get("triton")}
    if device.startswith("cuda"):
        d = telemetry.nvml(telemetry.device_index(device)).device()
        uuid = d.get("uuid")
        facts.update(kind="cuda", gpu_uuid=uuid if isinstance(uuid, str) else None, driver=d.get("driver"),
                     gpu_name=d.get("name") if isinstance(d.get("name"), str) else None)
        if facts["gpu_uuid"] is None:  # no NVML: the device name is the best we have, said in the key
            facts["gpu_uuid"] = f"unknown:{facts['gpu_name']}"
    else:
        facts.update(kind="cpu", cpu=telemetry._cpu_model(), cpus=os.cpu_count())
    return facts


def calibration_key(device: str, facts: dict | None = None) -> str:
    """Readable prefix + a hash of every fact (GPU UUID, driver, torch, triton / CPU model, count)."""
    facts = facts if facts is not None else key_facts(device)
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{facts.get('kind')}/{facts.get('gpu_uuid') or facts.get('cpu')}/{digest}"
