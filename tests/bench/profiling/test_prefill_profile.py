"""The prefill profiler's GPU-busy figure: the union of kernel intervals, never their sum."""
from bench.profiling.prefill_profile import busy_seconds


def test_busy_is_the_union_of_kernel_intervals():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0.0, 1.0), (2.0, 3.0)]) == 2.0  # a gap between kernels is idle time
    assert busy_seconds([(0.0, 2.0), (1.0, 3.0), (1.5, 1.8)]) == 3.0  # overlapping streams count once
    assert busy_seconds([(5.0, 6.0), (0.0, 1.0)]) == 2.0  # order of events does not matter
