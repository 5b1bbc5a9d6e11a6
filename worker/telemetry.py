"""Host and GPU facts for receipts, and the foreign-GPU-process check (NVML via nvidia-ml-py).

Every value is a number/string or None together with a reason; nothing unknown becomes 0.
"""
from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from functools import lru_cache


def na(reason: str) -> dict:
    return {"value": None, "reason": reason}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _versions() -> dict:
    out = {"python": platform.python_version()}
    from importlib import metadata

    for mod in ("torch", "triton", "numpy", "scipy", "gguf"):
        try:
            out[mod] = metadata.version(mod)
        except metadata.PackageNotFoundError:
            out[mod] = None
            out[f"{mod}_reason"] = "not installed"
    return out


class Nvml:
    """Thin wrapper; `ok` is False with `reason` when NVML or the device is unavailable."""

    def __init__(self, index: int = 0):
        self.ok, self.reason, self.handle = False, None, None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.ok = True
        except Exception as exc:  # noqa: BLE001 - no driver / no GPU on this host
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"[:200]

    def _get(self, fn, *args):
        if not self.ok:
            return na(self.reason)
        try:
            return getattr(self.nv, fn)(self.handle, *args)
        except Exception as exc:  # noqa: BLE001 - a counter this GPU does not support
            return na(f"{fn}: {type(exc).__name__}")

    def device(self) -> dict:
        if not self.ok:
            return {"name": None, "reason": self.reason}
        mem = self._get("nvmlDeviceGetMemoryInfo")
        return {
            "name": self._get("nvmlDeviceGetName"),
            "driver": self.nv.nvmlSystemGetDriverVersion(),
            "memory_total_bytes": getattr(mem, "total", None),
            "uuid": self._get("nvmlDeviceGetUUID"),
        }

    def sample(self) -> dict:
        """Clocks, temperature, power, energy counter, memory used: one snapshot."""
        if not self.ok:
            return {"reason": self.reason}
        nv = self.nv
        energy = self._get("nvmlDeviceGetTotalEnergyConsumption")  # mJ since driver load
        mem = self._get("nvmlDeviceGetMemoryInfo")
        return {
            "sm_clock_mhz": self._get("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._get("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM),
            "temperature_c": self._get("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
            "power_mw": self._get("nvmlDeviceGetPowerUsage"),
            "energy_mj": energy,
            "memory_used_bytes": getattr(mem, "used", None) if not isinstance(mem, dict) else None,
        }

    def compute_pids(self) -> list[int] | None:
        if not self.ok:
            return None
        try:
            return [p.pid for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)]
        except Exception:  # noqa: BLE001
            return None

    def process_utilization(self, since_s: float) -> list[tuple[int, int, float]] | None:
        """(pid, SM %, sample time in epoch seconds) of every process NVML sampled after `since_s`
        (one sample per process: its latest period with non-zero use); None when unsupported."""
        if not self.ok:
            return None
        try:
            samples = self.nv.nvmlDeviceGetProcessUtilization(self.handle, int(since_s * 1e6))
        except Exception as exc:  # noqa: BLE001
            if "Not Found" in str(exc) or type(exc).__name__.endswith("NotFound"):
                return []  # no process used the GPU since then
            return None
        return [(int(s.pid), int(s.smUtil), s.timeStamp / 1e6) for s in samples]

    def utilization_period_s(self) -> float | None:
        """NVML's utilisation sampling period on this GPU: the median gap between its recent GPU
        utilisation samples (None when it keeps none)."""
        if not self.ok:
            return None
        try:
            _, samples = self.nv.nvmlDeviceGetSamples(self.handle, self.nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
        except Exception:  # noqa: BLE001
            return None
        ts = sorted({s.timeStamp for s in samples})
        gaps = sorted(b - a for a, b in zip(ts, ts[1:]) if b > a)
        return gaps[len(gaps) // 2] / 1e6 if gaps else None

    def process_memory(self, pids: set[int]) -> int | None:
        if not self.ok:
            return None
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:  # noqa: BLE001
            return None
        used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
        return sum(used) if used else None


@lru_cache(maxsize=4)
def nvml(index: int = 0) -> Nvml:
    return Nvml(index)


def device_index(device: str) -> int:
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


def host_facts(device: str) -> dict:
    facts = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
    }
    if device.startswith("cuda"):
        facts["gpu"] = nvml(device_index(device)).device()
    else:
        facts["gpu"] = {"name": None, "reason": "CPU evaluation"}
    return facts


def fingerprint(device: str) -> str:
    """The key A/A records are stored under: what makes noise comparable (device model, host)."""
    if device.startswith("cuda"):
        name = nvml(device_index(device)).device().get("name")
        return f"{socket.gethostname()}/cuda/{name}"
    return f"{socket.gethostname()}/cpu/{_cpu_model()}/{os.cpu_count()}"


@dataclass
class ResourceWindow:
    """Start/end snapshots around a measurement phase."""

    device: str
    start: dict = field(default_factory=dict)
    end: dict = field(default_factory=dict)

    def open(self):
        self.start = self._snap()
        return self

    def close(self):
        self.end = self._snap()
        return self

    def _snap(self) -> dict:
        snap = {"loadavg": list(os.getloadavg())}
        if self.device.startswith("cuda"):
            snap["gpu"] = nvml(device_index(self.device)).sample()
        return snap

    def to_dict(self) -> dict:
        d = {"start": self.start, "end": self.end}
        if self.device.startswith("cuda"):
            e0 = self.start.get("gpu", {}).get("energy_mj")
            e1 = self.end.get("gpu", {}).get("energy_mj")
            if isinstance(e0, int) and isinstance(e1, int):
                d["energy_j"] = (e1 - e0) / 1000.0
            else:
                d["energy_j"] = na("NVML energy counter unavailable on this GPU")
        else:
            d["energy_j"] = na("CPU evaluation: no NVML energy counter")
        return d
