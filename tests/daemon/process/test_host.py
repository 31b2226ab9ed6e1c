"""Host resources: the thread count compute may use, freed heap going back to the OS when idle, and the
KV pools' pages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixd.daemon.process import host
from radixd.daemon.process.host import (
    ENV_THREADS,
    HUGE_PAGE,
    HeapReleaser,
    configure_threads,
    cpu_quota,
    usable_cpus,
    zeros_on_huge_pages,
)


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path: Path, files: dict[str, str], want: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(tmp_path) == want


def test_threads_default_to_what_the_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.delenv(ENV_THREADS, raising=False)
    try:
        assert 1 <= configure_threads() <= usable_cpus()
        # A process allowed one CPU (affinity or quota) computes on one thread, whatever torch's
        # default is.
        torch.set_num_threads(2)
        monkeypatch.setattr(host, "usable_cpus", lambda: 1)
        assert configure_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.undo()
        monkeypatch.delenv(ENV_THREADS, raising=False)
        monkeypatch.setenv(ENV_THREADS, "1")
        assert configure_threads() == 1 and torch.get_num_threads() == 1
        for bad in ("0", "two", "-3"):
            monkeypatch.setenv(ENV_THREADS, bad)
            with pytest.raises(ValueError, match=ENV_THREADS):
                configure_threads()
    finally:
        torch.set_num_threads(before)


def test_release_waits_for_idle_and_runs_once_per_busy_period() -> None:
    heap = HeapReleaser(idle_s=10.0)
    assert heap.available  # glibc: the project's Linux machines
    assert not heap.idle(0.0)  # nothing ran yet
    heap.busy(100.0)
    assert not heap.idle(101.0)  # not idle long enough
    assert heap.idle(110.0)
    assert not heap.idle(120.0)  # already released for this busy period
    assert heap.releases == 1


_RELEASE_SCRIPT = """
import torch
from radixd.daemon.process.host import HeapReleaser

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))

# Freeing an 8 MiB mmapped tensor raises glibc's dynamic mmap threshold past 4 MiB, so the 4 MiB
# tensors below come from the heap; the one kept alive last pins the heap's top, so glibc's own
# top trimming cannot give the freed ones back: only a release can.
del_me = torch.ones(2 << 20)
del del_me
chunks = [torch.ones(1 << 20) for _ in range(48)]
keep = chunks.pop()
del chunks
freed = rss_mb()
heap = HeapReleaser(idle_s=0.0)
heap.busy(5.0)
assert heap.idle(5.0)
print(freed - rss_mb(), float(keep[0]))
"""


def test_release_returns_freed_heap_to_the_os() -> None:
    # A fresh interpreter: the test process's heap after other tests holds holes of unknown layout.
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    released_mb, kept = map(float, out.stdout.split())
    assert released_mb > 100, out.stdout  # 47 freed tensors of 4 MiB: ~188 MB
    assert kept == 1.0


_FREEZE_SCRIPT = """
import gc
from radixd.daemon.process.host import startup_heap_frozen
kept = [[i] for i in range(50_000)]  # container objects the collector tracks
with startup_heap_frozen() as frozen:
    later = [[i] for i in range(10)]
    seen = {id(o) for o in gc.get_objects()}
    print(frozen, gc.get_freeze_count(), id(kept[0]) in seen, id(later[0]) in seen)
print(gc.get_freeze_count(), id(kept[0]) in {id(o) for o in gc.get_objects()})
"""


def test_the_startup_heap_is_frozen_while_serving_and_later_objects_are_not() -> None:
    # A fresh interpreter: freezing is for a process that serves until it exits, not this one.
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE_SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    frozen, count, old_seen, new_seen, after, thawed_seen = out.stdout.split()
    assert int(frozen) > 50_000 and int(count) > 50_000  # (a frozen object that dies leaves the count)
    assert (old_seen, new_seen) == ("False", "True")  # full collections walk only what came after
    assert (after, thawed_seen) == ("0", "True")  # thawed once serving ends


def vm_flags(addr: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `addr` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_large_pools_start_on_a_huge_page_advised_as_huge_pages() -> None:
    shape = (700, 16, 3, 64)  # 4.1 MiB of f16: two huge pages and a tail
    t = zeros_on_huge_pages(shape, torch.float16)
    assert t.shape == shape and t.dtype == torch.float16 and t.is_contiguous()
    assert torch.equal(t, torch.zeros(shape, dtype=torch.float16))
    if sys.platform == "linux":
        assert t.data_ptr() % HUGE_PAGE == 0
        assert "hg" in vm_flags(t.data_ptr()), "the pool's mapping was not advised MADV_HUGEPAGE"
    t[-1] = 1.0  # the whole view is the tensor's own memory
    assert float(t.sum()) == 16 * 3 * 64


def test_small_tensors_are_plain_zeros() -> None:
    t = zeros_on_huge_pages((3, 5), torch.float32)
    assert torch.equal(t, torch.zeros(3, 5)) and t.is_contiguous()
