"""A server process's memory and libraries as Linux shows them (/proc), and the machine's load:
what the benchmarks record next to their timings."""

from __future__ import annotations

import os
import subprocess
import threading


def find_openblas() -> str | None:
    """The libopenblas.so.0 path, as the dynamic loader knows it (agent_memory/blas.py loads it by name)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if "libopenblas.so.0" in line and "=>" in line:
            return line.split("=>", 1)[1].strip()
    for path in ("/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
                 "/lib/aarch64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"):
        if os.path.exists(path):
            return path
    return None


def has_openblas(pid: int) -> bool | None:
    """Whether Debian's OpenBLAS is mapped (numpy's own bundled OpenBLAS does not count)."""
    lib = find_openblas()
    real = os.path.realpath(lib) if lib else None
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    return bool(real and real in maps) or "libopenblas.so.0" in maps


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (Linux)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process, in bytes (Linux); {} elsewhere or once it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def rss_bytes(pid: int) -> int:
    """A process's resident memory: /proc on Linux, ps elsewhere; 0 once it is gone."""
    rss = proc_status(pid).get("VmRSS")
    if rss is not None:
        return rss
    try:
        out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
        return int(out.stdout.strip() or 0) * 1024
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


class RSSSampler:
    """Polls the VmRSS of a process and its children in a thread; peak = max(sampled sum,
    the process's own VmHWM read at stop)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def _sample(self) -> None:
        own = proc_status(self.pid)
        if own:
            pids = process_tree(self.pid)
            self.last = own.get("VmRSS", 0) + sum(proc_status(p).get("VmRSS", 0) for p in pids[1:])
            self.peak = max(self.peak, self.last, own.get("VmHWM", 0))

    def stop(self) -> int:
        self._sample()
        self._stop.set()
        self._thread.join()
        return self.peak
