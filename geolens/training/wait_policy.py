"""How torch's OpenMP threads wait, chosen from the machine's load before torch starts (imports no torch).

torch's CPU kernels run on an OpenMP team (libgomp) whose idle threads spin before they sleep. On a quiet
machine that is fastest; when another process holds a core, a thread spins while the sibling it waits for is
descheduled, and a 2-thread step takes 5-10x longer than on one thread. OMP_WAIT_POLICY=PASSIVE (sleep at
once) avoids that but costs a quiet machine about a third. The wait policy does not change any result (the
thread count does: it sets the order of the sums), so the policy is chosen per process from the load at its
start, and the thread count stays torch's default (or the run's own when resumed: training.train).

choose_wait_policy sets OMP_WAIT_POLICY=PASSIVE when other processes keep busy more cores than the threads
leave free; it must run before `import torch` (libgomp reads the variable once, when it loads), so the
commands that train call it first. A policy set by the user (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept.
storage.machine records the policy in run.json. docs/performance.md has the measurements.
"""

from __future__ import annotations

import os
import sys
import time

from geolens.threads import cpu_cores

SAMPLE_S = 0.2  # how long the load is sampled before torch starts
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]] | None:
    """{cpu: (busy jiffies, total jiffies)} of `cpus` from /proc/stat, or None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (sum(values) - values[3] - values[4], sum(values))
    return out or None


def busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """How many of this process's cores (cpu_cores) other processes keep busy, measured over
    `sample_s` seconds while this one sleeps; None where /proc/stat is not available (not Linux)."""
    cpus = set(cpu_cores())
    before = _cpu_times(cpus)
    if before is None:
        return None
    time.sleep(sample_s)
    after = _cpu_times(cpus) or {}
    return sum((after[c][0] - b[0]) / max(after[c][1] - b[1], 1) for c, b in before.items() if c in after)


def default_threads(environ=os.environ) -> int:
    """The intra-op threads torch will start with: OMP_NUM_THREADS, else the cores this process may use."""
    try:
        return max(1, int(environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return len(cpu_cores())


def contended(busy: float, cores: int, threads: int) -> bool:
    """Whether `threads` threads on `cores` cores would wait for descheduled siblings: other processes keep
    busy more than the cores the threads leave free, plus half a core."""
    return threads > 1 and busy > cores - threads + 0.5


def choose_wait_policy(environ=os.environ) -> str:
    """Set OMP_WAIT_POLICY=PASSIVE in `environ` when the machine is contended (contended, with busy_cores
    measured now); returns why, in words. Does nothing when torch is already imported (too late for libgomp),
    when the user set a policy, or with one thread (nothing waits)."""
    if "torch" in sys.modules:
        return "torch was already imported: the wait policy is the one it started with"
    if any(v in environ for v in USER_VARIABLES):
        return "the wait policy set in the environment"
    cores = len(cpu_cores())
    threads = default_threads(environ)
    if threads < 2:
        return "one thread: nothing waits"
    busy = busy_cores()
    if busy is None:
        return "the load cannot be measured here: libgomp's default wait policy"
    if contended(busy, cores, threads):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return f"other processes keep {busy:.1f} of {cores} cores busy: OMP_WAIT_POLICY=PASSIVE"
    return f"other processes keep {busy:.1f} of {cores} cores busy: libgomp's default wait policy (spin, then sleep)"


def wait_policy(environ=os.environ) -> str:
    """The wait policy of this process's OpenMP threads as run.json records it: OMP_WAIT_POLICY's value,
    GOMP_SPINCOUNT=N when set, or 'default' (libgomp spins a while, then sleeps)."""
    parts = [environ[v] if v == "OMP_WAIT_POLICY" else f"{v}={environ[v]}" for v in USER_VARIABLES if v in environ]
    return ", ".join(parts) or "default"
