"""Message sizes: ``128K``-style parsing and the nccl-tests size sweep."""

from __future__ import annotations

import re

from collectives import InvalidArgumentError

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
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

    With neither ``factor`` nor ``step`` the factor is 2.

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
    if factor is not None and step is not None:
        raise InvalidArgumentError(
            f"size_sweep: give a step factor (-f) or step bytes (-i), not both; got -f {factor} "
            f"and -i {step}"
        )
    if step is not None:
        if step < 1:
            raise InvalidArgumentError(f"size_sweep: step bytes (-i) must be >= 1, got {step}")
        return list(range(min_bytes, max_bytes + 1, step))
    factor = 2 if factor is None else factor
    if factor < 2:
        raise InvalidArgumentError(f"size_sweep: step factor (-f) must be >= 2, got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes
