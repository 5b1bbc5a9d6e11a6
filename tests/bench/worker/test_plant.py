"""The planted slowdown of the detection run (bench/worker/gpu_calibration.py) must slow the engine
and change nothing else the harness can see: a plant that also changed how the driver collects the
per-step logits measured that change, not the plant (1 % plant on 9B decode read as -0.2 %,
gpu-calibration-standard-20261203T202147Z.json)."""
import time

from bench.worker.gpu_calibration import PLANT_PATCH
from worker.harness.driver import _accepts


class Engine:
    def __init__(self):
        self.got = None

    def prefill(self, ids, all_logits=False):
        time.sleep(0.02)
        return [0.0]

    def generate_greedy(self, n, logits_out=None):
        time.sleep(0.04)
        self.got = logits_out
        return list(range(n))

    def synchronize(self):
        pass


def planted(share):
    ns = {"load_engine": lambda *a, **k: Engine()}
    exec(PLANT_PATCH.format(share=share), ns)
    return ns["load_engine"]()


def test_the_plant_keeps_the_signature_the_driver_reads():
    eng = planted(0.5)
    assert _accepts(eng.generate_greedy, "logits_out")  # else the driver's hooked path: no logits copies
    buf = object()
    assert eng.generate_greedy(3, logits_out=buf) == [0, 1, 2] and eng.got is buf


def test_the_plant_busy_waits_its_share_of_each_call():
    eng = planted(0.5)
    for call, plain_s in ((lambda: eng.generate_greedy(2), 0.04), (lambda: eng.prefill([1]), 0.02)):
        t0 = time.perf_counter()
        call()
        assert time.perf_counter() - t0 >= plain_s * 1.5
