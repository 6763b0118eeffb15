"""The memory watermark counts what this server uses, not the whole machine (issue 32, item 11).

On a busy shared box, 90% of host memory counted machine-wide made the server answer 503 to everything while
it used little itself. On the CPU the watermark now reads this process's own memory (its resident set) against
the memory it may have (its cgroup's limit when one is set, else the host's), and the cgroup's working set
against that limit; a 503 names the watermark hit. Readings are faked; the cgroup files are written under
tmp_path in both layouts (v2 and v1).
"""

from __future__ import annotations

import pytest

from engine.errors import MemoryPressureError
from engine.memory import MemoryGuard, MemorySources, cgroup_memory, read_memory
from engine.options import EngineSettings

GIB = 1 << 30


def _sources(system=None, process=None, host=16 * GIB, cgroup=None) -> MemorySources:
    return MemorySources(system=lambda: system, mps=lambda: None, cuda=lambda i: None,
                         process=lambda: process, host_total=lambda: host, cgroup=lambda: cgroup)


def _guard(sources: MemorySources) -> MemoryGuard:
    return MemoryGuard(EngineSettings(memory_watermark=0.9, on_memory_pressure="refuse"),
                       lambda device: read_memory(device, sources), release=lambda device: None)


def test_a_busy_machine_does_not_refuse_a_server_that_uses_little() -> None:
    busy_box = _sources(system=(int(15.5 * GIB), 16 * GIB), process=2 * GIB)  # others hold 13.5 GiB
    admitted = _guard(busy_box).admit("cpu")  # before: 97% of the host counted, 503 for every request
    assert admitted.action == "ok" and admitted.reading.source == "process"
    assert admitted.reading.fraction == pytest.approx(2 / 16)


def test_the_server_itself_over_the_watermark_is_refused_and_the_503_names_the_watermark() -> None:
    with pytest.raises(MemoryPressureError) as caught:
        _guard(_sources(process=int(15 * GIB))).admit("cpu")
    message = str(caught.value)
    assert "memory_watermark" in message and "this server's own memory" in message and "90%" in message
    assert "15.0 GiB" in message and "16.0 GiB" in message


def test_a_cgroup_limit_is_the_total_and_its_working_set_counts() -> None:
    # a 4 GiB container on a 64 GiB host: the process's 3.8 GiB is 95% of what it may have
    with pytest.raises(MemoryPressureError) as caught:
        _guard(_sources(process=int(3.8 * GIB), host=64 * GIB, cgroup=(GIB, 4 * GIB))).admit("cpu")
    assert "this server's own memory" in str(caught.value) and "cgroup limit" in str(caught.value)
    # the container's working set (other processes in it too) near its limit: refused, naming the cgroup
    with pytest.raises(MemoryPressureError) as caught:
        _guard(_sources(process=GIB, host=64 * GIB, cgroup=(int(3.9 * GIB), 4 * GIB))).admit("cpu")
    assert "cgroup" in str(caught.value) and "memory_watermark" in str(caught.value)
    assert _guard(_sources(process=GIB, host=64 * GIB, cgroup=(2 * GIB, 4 * GIB))).admit("cpu").action == "ok"


def test_cgroup_files_are_read_in_both_layouts(tmp_path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "app").mkdir(parents=True)
    (v2 / "app" / "memory.max").write_text("4294967296\n")
    (v2 / "app" / "memory.current").write_text(str(3 * GIB) + "\n")
    (v2 / "app" / "memory.stat").write_text(f"anon 123\nfile 456\ninactive_file {GIB}\nactive_file 7\n")
    proc = tmp_path / "cgroup-v2"
    proc.write_text("0::/app\n")
    assert cgroup_memory(v2, proc) == (2 * GIB, 4 * GIB)  # working set: usage less the inactive file cache
    (v2 / "app" / "memory.max").write_text("max\n")
    assert cgroup_memory(v2, proc) is None  # no limit: nothing to read against

    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(8 * GIB))
    (v1 / "memory" / "memory.usage_in_bytes").write_text(str(5 * GIB))
    (v1 / "memory" / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {GIB}\n")
    proc1 = tmp_path / "cgroup-v1"
    proc1.write_text("12:memory:/\n3:cpu,cpuacct:/\n")
    assert cgroup_memory(v1, proc1) == (4 * GIB, 8 * GIB)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # "unlimited" in v1
    assert cgroup_memory(v1, proc1) is None
    assert cgroup_memory(tmp_path / "none", tmp_path / "missing") is None


def test_the_real_readers_give_this_process_a_reading() -> None:
    reading = read_memory("cpu")
    assert reading.source in ("process", "cgroup") and 0 < reading.used < reading.total
