"""The GPU's temperature: first-order lag toward a utilisation-dependent target.

``T`` moves toward ``idle + (max - idle) * utilisation`` with time constant ``tau``:
``T(t + dt) = target + (T(t) - target) * exp(-dt / tau)``. Time is injected.
"""

from __future__ import annotations

import math

from kvgate.types import Seconds


class GpuThermal:
    """A device's temperature, advanced by the engine through busy and idle intervals."""

    __slots__ = ("idle_c", "max_c", "tau_s", "temp_c", "time")

    def __init__(self, idle_c: float, max_c: float, tau_s: float) -> None:
        self.idle_c = idle_c
        self.max_c = max_c
        self.tau_s = tau_s
        self.temp_c = idle_c
        # Unknown until the first advance: the driver's clock may start anywhere.
        self.time: Seconds | None = None

    def advance(self, to: Seconds, utilisation: float) -> float:
        """Run at ``utilisation`` (0..1) until ``to``; returns the temperature then.

        Time never runs backwards: a ``to`` before the last advance changes nothing
        (a driver reading stats in the middle of a step it already simulated).
        """
        if self.time is None:
            self.time = to
            return self.temp_c
        dt = to - self.time
        if dt <= 0:
            return self.temp_c
        target = self.idle_c + (self.max_c - self.idle_c) * min(max(utilisation, 0.0), 1.0)
        self.temp_c = target + (self.temp_c - target) * math.exp(-dt / self.tau_s)
        self.time = to
        return self.temp_c
