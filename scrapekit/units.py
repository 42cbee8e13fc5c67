"""Durations and sizes as a recipe writes them (``30s``, ``4h``, ``200KB``), and the option types
that mark a constructor parameter as one of them."""

from __future__ import annotations

import re
import time
from typing import NewType

Seconds = NewType("Seconds", float)
"""A constructor parameter annotated ``Seconds`` takes a duration: ``500ms``, ``30s``, ``10m``, ``4h``, ``1d`` or a number of seconds."""

Bytes = NewType("Bytes", int)
"""A constructor parameter annotated ``Bytes`` takes a size: ``200KB``, ``10GB``, ``64KiB`` or a number of bytes."""

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_UNITS = {
    "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_NUMBER_UNIT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_duration(value: object) -> Seconds:
    """Seconds from ``1.5``, ``"30s"``, ``"4h"``; ValueError with what is expected otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a duration like 500ms, 30s, 10m, 4h or 1d, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"expected a duration of 0 or more, got {value!r}")
        return Seconds(float(value))
    match = _NUMBER_UNIT.fullmatch(value)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _DURATION_UNITS):
        raise ValueError(f"expected a duration like 500ms, 30s, 10m, 4h or 1d, got {value!r}")
    return Seconds(float(match.group(1)) * _DURATION_UNITS[unit or "s"])


def parse_size(value: object) -> Bytes:
    """Bytes from ``1000``, ``"200KB"``, ``"64KiB"`` (KB = 1000, KiB = 1024)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected a size like 200KB, 256MB or 64KiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a size of 0 or more, got {value!r}")
        return Bytes(value)
    match = _NUMBER_UNIT.fullmatch(value)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in _SIZE_UNITS):
        raise ValueError(f"expected a size like 200KB, 256MB or 64KiB, got {value!r}")
    return Bytes(int(float(match.group(1)) * _SIZE_UNITS[unit or "b"]))


def format_size(n: int) -> str:
    """``n`` bytes the way a recipe writes sizes, in powers of 1000: ``512B``, ``5.0KB``, ``12.3GB``."""
    if abs(n) < 1000:
        return f"{n}B"
    size = float(n)
    for unit in ("KB", "MB", "GB"):
        size /= 1000
        if abs(size) < 1000:
            return f"{size:.1f}{unit}"
    return f"{size / 1000:.1f}TB"


def utc_text(seconds: float) -> str:
    """A time as logs and status show it: ``2026-11-23T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
