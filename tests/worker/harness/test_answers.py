"""What the worker keeps of a revision's answers is bounded in shape (the revision can rewrite the driver's frame
writer, so every field is its word): its memory report and its version text."""
from worker.harness.client import MEMORY_ENTRIES, TEXT_CAP, bounded_memory, short_text


def test_the_drivers_memory_report_is_kept():
    report = {"peak_bytes": 123, "state_bytes": None, "weights_bytes": 4.5e9}
    assert bounded_memory(report) == report


def test_a_memory_report_of_another_shape_is_not_kept():
    assert bounded_memory(None) is None and bounded_memory(["peak", 1]) is None
    assert bounded_memory({f"k{i}": 1 for i in range(MEMORY_ENTRIES + 1)}) is None  # 20 000 entries reached a receipt


def test_text_in_a_memory_report_or_a_version_is_short():
    kept = bounded_memory({"k" * 1000: "x" * 10_000, "peak_bytes": True})
    ((key, value), (_, flag)) = kept.items()
    assert len(key) == 64 and len(value) == TEXT_CAP and flag == "True"
    assert len(short_text("9" * (1 << 20))) == TEXT_CAP and short_text(None) is None
