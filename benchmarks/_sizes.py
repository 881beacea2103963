"""Message sizes: ``128K``-style parsing and the nccl-tests size sweep."""

from __future__ import annotations

import re

from collectives import InvalidArgumentError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: nccl-tests' default step bytes (-i), used when the step factor is 1
DEFAULT_STEP = 1 << 20
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, arg: str = "size") -> int:
    """Bytes from ``"8"``, ``"128K"``, ``"128M"``, ``"1G"`` (binary units, as nccl-tests).

    Example:
        >>> parse_size("128K")
        131072
    """
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise InvalidArgumentError(
            f"parse_size: {arg} must be a byte count like 8, 128K, 128M or 1G, got {text!r}"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def size_sweep(
    min_bytes: int, max_bytes: int, factor: int | None = None, step: int | None = None
) -> list[int]:
    """The sizes nccl-tests visits: ``min_bytes`` times ``factor`` (or plus ``step``) up to max.

    As in nccl-tests, a factor above 1 wins over ``step``; a factor of 1 adds ``step``
    (1 MiB unless given). With neither, the factor is 2.

    Example:
        >>> size_sweep(8, 64, factor=2)
        [8, 16, 32, 64]
        >>> size_sweep(1024, 3072, step=1024)
        [1024, 2048, 3072]
    """
    if min_bytes < 1:
        raise InvalidArgumentError(f"size_sweep: min_bytes (-b) must be >= 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise InvalidArgumentError(
            f"size_sweep: max_bytes (-e) must be >= min_bytes (-b) = {min_bytes}, got {max_bytes}"
        )
    if factor is None:
        factor = 1 if step is not None else 2
    if factor < 1:
        raise InvalidArgumentError(f"size_sweep: step factor (-f) must be >= 1, got {factor}")
    if factor == 1:
        step = DEFAULT_STEP if step is None else step
        if step < 1:
            raise InvalidArgumentError(f"size_sweep: step bytes (-i) must be >= 1, got {step}")
        return list(range(min_bytes, max_bytes + 1, step))
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes
