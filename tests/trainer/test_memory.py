"""The one memory meter in its three scopes: a process's peak that resets between
measurements, tensors' transient peak above the level at entry, and a run's running peak."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from amptrain.trainer.memory import MemoryMeter


_PEAKS = """
import torch
from amptrain.trainer.memory import MemoryMeter, free_memory, rss_bytes
meter = MemoryMeter(torch.device("cpu"), "process")
free_memory(torch.device("cpu"))
before = rss_bytes()
big = meter.measure(lambda: torch.ones(50 << 20, dtype=torch.float32).sum())  # 200 MiB
free_memory(torch.device("cpu"))
before_small = rss_bytes()
small = meter.measure(lambda: torch.ones(10 << 20, dtype=torch.float32).sum())  # 40 MiB
print(big - before, small - before_small)
"""


@pytest.mark.skipif(not MemoryMeter(torch.device("cpu"), "process").resettable,
                    reason="needs a resettable peak RSS (Linux /proc/self/clear_refs)")
def test_peak_rss_meter_resets_between_probes():
    # In a fresh process: late in a long test session the allocator keeps freed pages
    # that malloc_trim cannot return (fragmentation), and a 40 MiB tensor fits in them.
    done = subprocess.run([sys.executable, "-c", _PEAKS], capture_output=True, text=True,
                          check=True, timeout=300)
    big, small = map(int, done.stdout.split())
    assert big >= 190 << 20
    assert 30 << 20 <= small <= 90 << 20  # its own peak, not the earlier one


def test_tensor_scope_sees_a_transient_freed_inside_the_span():
    meter = MemoryMeter(torch.device("cpu"), "tensors")
    with meter.span() as peak:
        big = torch.ones(1 << 20)  # 4 MiB held, then freed
        del big
        small = torch.ones(1 << 10)
    assert 4 << 20 <= peak["bytes"] < 5 << 20
    del small


def test_running_scope_reads_a_positive_peak():
    meter = MemoryMeter(torch.device("cpu"), "running")
    meter.start()
    assert meter.peak() > 0 and "RSS" in meter.source
    with pytest.raises(ValueError):
        MemoryMeter(torch.device("cpu"), "everything")
