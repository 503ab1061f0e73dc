"""The crash signs the supervisor, the soak, the benchmark and the test fixtures look for in a
tritonserver log (chattts_serving/deploy/logscan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chattts_serving.deploy.logscan import LogScanner, fatal_lines


@pytest.mark.parametrize("line", [
    "Signal (6) received.",
    "Signal (11) received.",
    "Signal (6) received: chattts gate's fatal-signal handler; tritonserver exits now (stack below)",
    "malloc(): unsorted double linked list corrupted",
    "malloc_consolidate(): unaligned fastbin chunk detected",
    "free(): double free detected in tcache 2",
    "double free or corruption (out)",
    "corrupted size vs. prev_size",
    "Fatal Python error: Segmentation fault",
    "terminate called after throwing an instance of 'boost::interprocess::lock_exception'",
    "==123==ERROR: AddressSanitizer: heap-use-after-free on address 0x602000000010",
    "gate.cc:512:7: runtime error: member access within null pointer of type 'struct Stream'",
])
def test_every_kind_of_crash_line_is_a_sign(line: str) -> None:
    assert fatal_lines(f"I1204 ok\n{line}\nI1204 after\n") == [line]


@pytest.mark.parametrize("line", [
    "Signal (2) received.",
    "Signal (15) received.",
    '{"ts":"2026","event":"request_finished","message":"text with corrupted and malloc() in it"}',
    'I1204 22:17:11.156867 13083 server.cc:321] "Timeout 10: Found 0 model versions that have in-flight inferences"',
])
def test_a_normal_stop_and_our_own_json_lines_are_not(line: str) -> None:
    assert fatal_lines(line) == []


def test_the_scanner_reads_only_what_was_written_since_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("Signal (6) received.\n")
    scanner = LogScanner(log, start_at_end=True)
    assert scanner.new_fatal_lines() == []
    with log.open("a") as f:
        f.write("I1204 fine\nFatal Python error: Segm")
    assert scanner.new_fatal_lines() == []
    with log.open("a") as f:
        f.write("entation fault\n")
    assert scanner.new_fatal_lines() == ["Fatal Python error: Segmentation fault"]
    assert scanner.new_fatal_lines() == []
    assert LogScanner(tmp_path / "missing.log").new_fatal_lines() == []
