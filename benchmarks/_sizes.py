"""Message sizes: ``128K``-style parsing and the nccl-tests size sweep."""

from __future__ import annotations

import re

from collectives import InvalidArgumentError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: nccl-tests' default step bytes (-i), used when the step factor is 1
DEFAULT_STEP = 1 << 20
# nccl-tests' sscanf(value, "%lf %1s"): a decimal number, then the first other character
_SIZE = re.compile(
    r"\s*([+-]?(?:0[xX][0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?(?:[pP][+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d*)?))\s*(\S?)"
)


def parse_size(text: str | int, arg: str = "size") -> int:
    """Bytes from ``"8"``, ``"128K"``, ``"1.5M"``, ``"1e3"``, ``"0x8"``, ``"1G"``, as
    nccl-tests reads them (C's ``%lf`` and a binary unit, the rest of the text ignored: ``2KB`` and ``3MiB`` are
    2 KiB and 3 MiB); ``T`` (TiB) and ``B`` (bytes) too. A fraction of a byte is dropped.

    Example:
        >>> parse_size("128K"), parse_size("1.5M"), parse_size("1e3")
        (131072, 1572864, 1000)
    """
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    unit = _UNITS.get(match.group(2).upper()) if match else None
    number = match.group(1) if match else ""
    if "x" in number.lower():
        value = float.fromhex(number)
    else:  # glibc's scanf takes "1e" for 1, the "e" swallowed
        value = float(number.rstrip("eE+-") or -1)
    if unit is None or value < 0:
        raise InvalidArgumentError(
            f"parse_size: {arg} must be a byte count like 8, 128K, 1.5M or 1G, got {text!r}"
        )
    return int(value * unit)


def c_integer(text: str) -> int:
    """An integer as nccl-tests reads one (C's ``strtol(text, NULL, 0)``): decimal, ``0x``
    hexadecimal or ``0`` octal; text after the number is refused here (C ignores it).

    Example:
        >>> c_integer("20"), c_integer("0x10"), c_integer("010"), c_integer("-1")
        (20, 16, 8, -1)
    """
    match = _INTEGER.fullmatch(text)
    if match is None:
        raise InvalidArgumentError(f"c_integer: expected an integer (8, 0x8, 010), got {text!r}")
    sign, digits = match.groups()
    if digits[:2].lower() == "0x":
        value = int(digits, 16)
    elif digits.startswith("0"):
        value = int(digits, 8)
    else:
        value = int(digits)
    return -value if sign == "-" else value


_INTEGER = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)\s*")


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
