"""What machine a benchmark ran on, and how fast it moves memory.

    describe_machine(device="cpu", dtype="bfloat16")   # CPU model, threads, load, versions, ...
    measure_memory_bandwidth_gbs()                      # best-of-N GB/s reading a large tensor

Decoding one token at batch size 1 reads every weight once, so a decoder is
memory-bound: ``weight bytes x target forwards / s`` ("bandwidth achieved", as
gpt-fast prints it) compared with what this machine can move shows how close the
loop runs to the hardware limit.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

from .config import dtype_name
from .openmp import wait_policy

logger = logging.getLogger(__name__)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; elsewhere what the platform module says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_id() -> str:
    """The CPU's model name and a short hash of its feature flags: what a per-machine cache (the cost model, the
    kernel path) is keyed by. Two VMs of one model name with other flags (AVX-512 masked off) get other ids."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = hashlib.sha256(line.encode()).hexdigest()[:8]
                break
    except OSError:
        pass
    return f"{cpu_model()} {flags}".strip()


def cache_dir() -> Path:
    """Where measurements of this machine are kept between processes: ``$DART_DEMO_CACHE``, else
    ``~/.cache/dart-demo``."""
    base = os.environ.get("DART_DEMO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dart-demo")
    return Path(base)


def keyed_file(folder: Path, key: dict) -> Path:
    """The JSON file in ``folder`` that a measurement made under ``key`` (machine, target, ...) is kept in: named by
    a hash of the key, so another machine's or version's measurement never reads as this one's."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"{digest}.json"


def write_json(path: Path, record: dict) -> None:
    """Writes ``record`` to ``path`` whole or not at all (another process may read it meanwhile); OSError as
    raised (a read-only home: the caller decides what that costs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 matmuls (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _memory_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)  # kB -> GiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - a missing optional package is just "not installed"
        return None


def describe_machine(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> dict:
    """A JSON-ready description of the machine, taken now (load average included)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on every platform
        load = None
    info = {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_bf16": cpu_supports_bf16(),
        "memory_gib": _memory_total_gib(),
        "torch_threads": torch.get_num_threads(),
        "openmp_wait": wait_policy(),       # whether torch's idle OpenMP threads spin beside the native kernels
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "dtype": dtype_name(dtype) if dtype is not None else None,
        "load_average": load,  # 1, 5, 15 minutes
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "transparent_huge_pages": transparent_huge_pages(),   # where the weights can go on 2 MiB pages
    }
    info.update(gemm_paths())
    return info


THP_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def transparent_huge_pages() -> str | None:
    """The kernel's transparent huge page mode ('always', 'madvise', 'never'); None where there is none."""
    try:
        text = THP_MODE_FILE.read_text()
    except OSError:
        return None
    chosen = [w[1:-1] for w in text.split() if w.startswith("[")]
    return chosen[0] if chosen else None


def last_level_cache_bytes() -> int | None:
    """Bytes of the largest CPU cache Linux lists for CPU 0 (the L3 on most servers); None where it lists none."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def gemm_paths() -> dict:
    """The native small-GEMM path calls run now (``gemm_path``: what the decoder and the LM head ran), the
    paths this CPU runs, best first, and how a call's rows are cut among threads (``gemm_split``: ranges per thread,
    0 = chunks; models/gemm_split.py); None where the extension is missing."""
    try:
        from . import _native
        return {"gemm_path": _native.small_gemm_path(), "gemm_paths": list(_native.small_gemm_paths()),
                "gemm_split": int(_native.small_gemm_split())}
    except Exception:  # noqa: BLE001 - an extension that does not load is reported as no path
        return {"gemm_path": None, "gemm_paths": None, "gemm_split": None}


def measure_memory_bandwidth_gbs(size_mib: int | None = None, repeats: int = 5,
                                 device: str | torch.device | None = None, kind: str = "read") -> float:
    """Best-of-``repeats`` memory bandwidth in GB/s (1e9 bytes/s) over a large buffer.

    kind="read": sum the buffer (bytes moved = size), the access pattern of streaming
    weights through a matmul; kind="copy": copy it (bytes moved = 2 x size: read +
    write). The buffer (default 256 MiB on CPU, 1 GiB on GPU) is far larger than any
    cache, so this is DRAM / HBM bandwidth as the current torch thread count achieves it.
    """
    if kind not in ("read", "copy"):
        raise ValueError(f"kind must be 'read' or 'copy', got {kind!r}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if size_mib is None:
        size_mib = 1024 if dev.type == "cuda" else 256
    if size_mib <= 0 or repeats <= 0:
        raise ValueError(f"size_mib and repeats must be positive, got {size_mib}, {repeats}")
    n = size_mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page before timing

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    best = float("inf")
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        if kind == "copy":
            dst.copy_(src)
        else:
            src.sum()
        sync()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    gbs = (2 if kind == "copy" else 1) * n * 4 / best / 1e9
    logger.info("memory bandwidth (%s, %d MiB, %d threads): %.1f GB/s", kind, size_mib, torch.get_num_threads(),
                gbs)
    return gbs


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all cores from /proc/stat, or None where there is no /proc."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    values = [int(v) for v in fields[1:9]]       # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class OtherLoad:
    """CPU time that other processes used while this process's timed work ran, summed over start/stop pairs.

    A browser on the same 2 cores as the page took about one core while a run streamed, and every engine's step
    then took twice as long; a page that times engines says so rather than leaving its speeds unexplained.
    ``cpus``: the other processes' mean number of busy CPUs over the timed intervals (steal time included: a
    hypervisor that ran someone else counts too); None without /proc/stat or before ``MIN_WALL_S`` were timed.
    Each sample reads /proc/stat and this process's times (jiffies, 10 ms), so one short interval is coarse; the
    errors of many are unbiased and the sum is kept unclamped until the end."""

    #: timed seconds below which ``cpus`` says nothing: /proc/stat counts 10-ms jiffies, and a run of tiny steps
    #: (0.02 s in all) read 0.6 busy CPUs from one or two stray ticks
    MIN_WALL_S = 0.5

    def __init__(self):
        self.other_s = 0.0
        self.wall_s = 0.0
        self._start: tuple[float, float, float] | None = None
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _sample(self) -> tuple[float, float, float] | None:
        machine = _cpu_times()
        if machine is None:
            return None
        own = os.times()
        return machine[0] / self._hz, own.user + own.system, time.perf_counter()

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> None:
        a, self._start = self._start, None
        b = self._sample() if a is not None else None
        if b is not None:
            self.other_s += (b[0] - a[0]) - (b[1] - a[1])
            self.wall_s += b[2] - a[2]

    @property
    def cpus(self) -> float | None:
        return max(0.0, self.other_s / self.wall_s) if self.wall_s >= self.MIN_WALL_S else None


def cpu_busy_fraction(interval_s: float = 2.0) -> float | None:
    """Share of the machine's CPU time (all cores) that something was using over ``interval_s``."""
    a = _cpu_times()
    time.sleep(interval_s)
    b = _cpu_times()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def busy_machine_reason(max_busy: float = 0.2, interval_s: float = 2.0) -> str | None:
    """Why this machine is too busy for timed benchmarks, or None when it is quiet.

    Two cores are easily shared: another process using a fifth of the CPU already moves tokens/s
    by more than the differences a benchmark reports. Sampled over ``interval_s`` from /proc/stat
    (the load average lags by minutes and is reported next to it)."""
    busy = cpu_busy_fraction(interval_s)
    if busy is None or busy <= max_busy:
        return None
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return (f"the machine is busy: {100 * busy:.0f}% of its CPU time was in use by other processes over "
            f"{interval_s:g} s before the benchmark (threshold {100 * max_busy:.0f}%; load average {load} on "
            f"{os.cpu_count()} CPUs), so tokens/s figures would not be reliable")
