"""engine.openmp: releasing a thread's OpenMP team, and thread counts fitted to the cores other processes
leave free (the load read from /proc is faked here; the effect on torch is checked in fresh processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.openmp import SAMPLE_S, OtherLoad, fitted_threads
from tests.support.paths import REPO

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libgomp: PyTorch's OpenMP on Linux")


def _run(code: str, threads: str | None = None) -> list[str]:
    """``code`` in a fresh process with libgomp's default waits (and OMP_NUM_THREADS=``threads`` if given)."""
    env_code = ("import os\nfor var in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT', 'OMP_NUM_THREADS'):\n"
                "    os.environ.pop(var, None)\n")
    if threads:
        env_code += f"os.environ['OMP_NUM_THREADS'] = '{threads}'\n"
    out = subprocess.run([sys.executable, "-c", env_code + code], capture_output=True, text=True, cwd=REPO,
                         check=True)
    return out.stdout.split()


@pytest.mark.parametrize("configured, cores, others, want", [
    (2, 2, 0.0, 2), (2, 2, 0.3, 2), (2, 2, 0.4, 2),  # a light neighbour: both cores stay ours
    (2, 2, 0.5, 1), (2, 2, 1.0, 1), (2, 2, 2.0, 1),  # a core mostly taken: one thread, never none
    (8, 8, 2.5, 5), (8, 8, 1.3, 7), (4, 8, 0.0, 4),  # never above the configured count
])
def test_threads_fit_the_cores_other_processes_leave_free(configured, cores, others, want) -> None:
    assert fitted_threads(configured, cores, others) == want


def test_other_load_is_the_machines_busy_time_less_this_process(monkeypatch) -> None:
    ticks = 100
    monkeypatch.setattr("engine.openmp._TICKS", ticks)
    readings = iter([(0.0, 1000, 500), (0.1, 1010, 505), (1.0, 1000 + 180, 500 + 90), None])
    load = OtherLoad(read=lambda: next(readings))
    assert load.cores() == 0.0  # the first reading opens the window
    assert load.cores() == 0.0  # 0.1 s later: shorter than SAMPLE_S, the last value stands
    assert SAMPLE_S < 1.0
    # 1 s: the machine was busy 180 ticks (1.8 cores), this process 90 of them: others kept 0.9 of a core
    assert load.cores() == pytest.approx(0.9)
    assert load.cores() is None  # unreadable: the caller keeps its configured count


@linux_only
def test_release_team_ends_the_calling_threads_openmp_workers() -> None:
    """A thread that ran a parallel region on 2 threads holds one worker; after release_team it holds none,
    and the next region starts a new team."""
    code = (
        "import torch\n"
        "from engine.openmp import loaded_libgomp, release_team\n"
        "if not loaded_libgomp(): print('none'); raise SystemExit\n"
        "torch.set_num_threads(2)\n"
        "count = lambda: len(os.listdir('/proc/self/task'))\n"
        "x = torch.ones(1 << 22)\n"
        "x.mul_(2).sum(); before = count()\n"
        "assert release_team(); after = count()\n"
        "x.mul_(2).sum(); again = count()\n"
        "print(before - after, again - after)\n"
    )
    out = _run(code)
    if out == ["none"]:
        pytest.skip("this PyTorch build does not use libgomp")
    assert out == ["1", "1"]


@linux_only
def test_fit_threads_sets_the_calling_threads_count_only() -> None:
    """With libgomp's spin, a thread whose neighbours keep all cores but half of one busy runs torch on one
    thread; the main thread keeps its own count; once the cores are free again, the configured count."""
    code = (
        "import threading, torch\n"
        "import engine.openmp as omp\n"
        "torch.set_num_threads(2); cores = os.cpu_count()\n"
        "class Load:\n"
        "    value = cores - 0.5\n"
        "    def cores(self): return self.value\n"
        "load, seen = Load(), []\n"
        "def work():\n"
        "    seen.append(omp.fit_threads(load)); seen.append(torch.get_num_threads())\n"
        "    load.value = 0.0; seen.append(omp.fit_threads(load))\n"
        "t = threading.Thread(target=work); t.start(); t.join()\n"
        "print(omp.spin_waits(), *seen, torch.get_num_threads(), min(2, cores))\n"
    )
    out = _run(code)
    if out[0] != "True":
        pytest.skip("this PyTorch build does not use libgomp")
    assert out[1:4] == ["1", "1", out[5]] and out[4] == "2"


@linux_only
def test_a_thread_count_fixed_in_omp_num_threads_stays() -> None:
    """OMP_NUM_THREADS (the user's, or Ray's per replica) fixes the count: no fit, whatever the load."""
    code = (
        "import torch\n"
        "import engine.openmp as omp\n"
        "class Load:\n"
        "    def cores(self): return float(os.cpu_count())\n"
        "print(omp.spin_waits(), omp.fits_threads(), omp.fit_threads(Load()), torch.get_num_threads())\n"
    )
    out = _run(code, threads="2")
    if out[0] != "True":
        pytest.skip("this PyTorch build does not use libgomp")
    assert out[1:] == ["False", "2", "2"]
