"""Unit constants and display formatting.

Inside the package every quantity is SI: bytes, seconds, FLOP, FLOP/s, bytes/s. Spec files name
their unit in the key (``hbm_gib``, ``bw_gbyte_per_s``, ``bw_gbit_per_s``, ``latency_us``) and are
converted once, when read. Display uses GiB/MiB (base 1024, with the "i") for bytes and plain SI
prefixes for counts (175e9 parameters is "175 B").
"""

from __future__ import annotations

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

KILO = 1e3
MEGA = 1e6
GIGA = 1e9
TERA = 1e12
PETA = 1e15

US = 1e-6  # seconds per microsecond
MS = 1e-3  # seconds per millisecond

BITS_PER_BYTE = 8


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Network rates are quoted in bits (InfiniBand HDR = 200 Gb/s); convert to bytes/s."""
    return gbit_per_s * GIGA / BITS_PER_BYTE


def fmt_bytes(n_bytes: float) -> str:
    """Format bytes with binary prefixes: ``fmt_bytes(80 * GIB) == '80.00 GiB'``."""
    n = float(n_bytes)
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float) -> str:
    """Format a count with SI words: ``fmt_count(175e9) == '175 B'`` (billion, not GiB)."""
    n = float(n)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g} {unit}"
    return f"{n:.0f}"


def fmt_seconds(s: float) -> str:
    """Format a duration: ``fmt_seconds(0.0123) == '12.30 ms'``."""
    s = float(s)
    if abs(s) >= 1.0:
        return f"{s:.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def fmt_rate(bytes_per_s: float) -> str:
    """Format a bandwidth in decimal GB/s (vendors quote links in base 1000)."""
    return f"{bytes_per_s / GIGA:.1f} GB/s"
