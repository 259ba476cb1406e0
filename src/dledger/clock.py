"""The one clock the runtime reads: monotonic milliseconds.

Sans-I/O parts (core/, broker/agent, the controller's leader) never read a clock: their drivers
pass `now_ms()` in, and the simulator passes its own time, so both run the same code.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Monotonic milliseconds: never goes back, unaffected by wall-clock steps."""
    return time.monotonic_ns() // 1_000_000
