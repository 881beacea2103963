"""The one deadline rule every wait follows: work, the NCCL watchdog, close, check mode.

An operation is overdue once more than ``timeout`` seconds have passed on the monotonic
clock since it started (since it was issued, or since a host thread entered NCCL for it).
"""

from __future__ import annotations

import time


def overdue(start: float, timeout: float, now: float | None = None) -> float | None:
    """Seconds waited since ``start`` when past ``timeout``, else None.

    Example:
        >>> overdue(start=0.0, timeout=1.5, now=2.0)
        2.0
    """
    waited = (time.monotonic() if now is None else now) - start
    return waited if waited > timeout else None
