"""Byte sizes as workloads' options take them: a plain number is bytes.

K, M, G (and KiB, MiB, GiB) are 1024-based, as nccl-tests and most GPU tools read them.
KB, MB, GB are 1000-based, as the SI and disk makers read them.
One parser for every workload, so that "64MB" means the same to membw as to collective."""

from __future__ import annotations

import re

from gpuvs.errors import UsageError

UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
         "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(option: str, text: object, most: int, most_label: str) -> int:
    """Bytes of `text` for the option named `option` (as the user typed it, e.g. "--size"), from 1 to `most`
    (`most_label`, e.g. "1 TiB"); bad input is one UsageError line saying what is allowed."""
    raw = str(text).strip()
    m = _SIZE.match(raw)
    unit = m.group(2).lower() if m else None
    if not m or unit not in UNITS:
        raise UsageError(f"{option} {raw!r} is not a size: a number of bytes, or with K, M, G (1024-based; also KiB, "
                         "MiB, GiB) or KB, MB, GB (1000-based), e.g. 8, 64K, 256MiB, 1GB")
    value = int(float(m.group(1)) * UNITS[unit])
    if not 1 <= value <= most:
        raise UsageError(f"{option} {raw!r} is out of range: from 1 byte to {most_label}")
    return value
