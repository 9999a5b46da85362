"""One worker's speed (``Speed``) and its online fit (``Fit``): recursive least squares with
forgetting on relative errors, as ``core.speed``'s module docs describe; the fleet's side
(the books, the fleet's median, lateness, ageing) is ``core.speed.FleetSpeed``'s. With the
values it is fed and reports (``Observation``, ``SpeedReport``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvgate.types import Seconds

SCALE = (1.0, 1e-3, 0.1, 0.1)  # features in units that keep the fit well conditioned
N = len(SCALE)


@dataclass(frozen=True, slots=True)
class Speed:
    """One worker's speed: fixed overhead (s), prefill (s per uncached token), decode (s per
    running request), and queueing (s per request waiting ahead, beyond its prefill: for
    a batch slot or KV room)."""

    overhead_s: float
    prefill_s: float
    decode_s: float
    queue_s: float = 0.0

    def ttft(self, tokens: float, running: float, waiting: float = 0.0) -> Seconds:
        """Predicted time to first token behind ``tokens`` uncached tokens (its own and those
        ahead), ``running`` requests decoding and ``waiting`` requests ahead."""
        return (
            self.overhead_s
            + self.prefill_s * tokens
            + self.decode_s * running
            + self.queue_s * waiting
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """What the gateway saw of one attempt, reported at its end: ``ttft`` from sending it
    to the first token (``None``: none came), ``usage``'s tokens, the mean time between
    output tokens after the first (``itl``, ``None``: not streamed), and the engine's own
    TTFT where its ``usage`` reports one (``engine_ttft``, in the engine's seconds: the
    emulated worker's model clock), free of the network and of the gateway's machine."""

    ttft: Seconds | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int = 0
    itl: Seconds | None = None
    engine_ttft: Seconds | None = None


@dataclass(frozen=True, slots=True)
class SpeedReport:
    """What ``/metrics`` shows of one worker: its speed, observations, and the median
    absolute relative error of the TTFT predicted at send time (``None``: none yet)."""

    speed: Speed
    observations: int
    ttft_error: float | None


@dataclass(slots=True)
class Fit:
    """One worker's fit: the parameters (scaled by ``SCALE``), their covariance, and what
    bounds and clips it."""

    theta: list[float]
    p: list[list[float]]
    n: int = 0
    scale: float = 0.3  # running mean absolute relative error, for clipping
    bias: float = 0.0  # running mean relative error: a run of one sign is a change, no outlier
    errors: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    uncached: float = 0.0  # mean uncached tokens a request (the engine's others' work)
    speed: Speed | None = None  # ``theta`` as a ``Speed``, rebuilt on each update
    floor: float = 0.05  # the least spread of a parameter (``spread``): grows with a rescale
    anchor: float = 0.0  # prefill (``theta[1]``) at the start, rescaled with it: the band's centre
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=64))  # the overhead's cap
    last: int = 0  # the fleet's update count at its last observation (its age)
    stretch: float = 0.0  # the gateway's TTFT over the engine's, lately (0: unknown)

    def step(
        self,
        features: tuple[float, ...],
        y: Seconds,
        *,
        lam: float,
        clip: float,
        warm: int,
        fitted: tuple[bool, ...],
        band: float,
        rescale: bool = True,
    ) -> None:
        """One observation: ``features`` (unscaled) gave a TTFT of ``y`` (``FleetSpeed``'s
        module docs: the rescale of a far-off prior, unless not ``rescale``, Huber
        clipping, the bounds)."""
        x = [f * s for f, s in zip(features, SCALE, strict=True)]
        theta, p = self.theta, self.p
        predicted = sum(t * xi for t, xi in zip(theta, x, strict=True))
        if rescale and self.n < warm and predicted > 0.0 and not 0.5 <= y / predicted <= 2.0:
            # A prior off by more than twice (an engine far slower or faster than the
            # profile said, e.g. a CPU llama.cpp against an H100 prior): rescale it at
            # once, in proportion. The fit's steps are relative, so from a prior a
            # hundred times off they would take hundreds of requests to get there.
            ratio = y / predicted
            self.anchor *= ratio if fitted[1] else 1.0
            for i in range(N):
                if fitted[i]:
                    theta[i] *= ratio
                    for j in range(N):
                        p[i][j] *= ratio * (ratio if fitted[j] else 1.0)
            # A parameter at nought is not rescaled: its room to move grows instead (a
            # queue the prior never saw, e.g. a llama.cpp worker's requests waiting a slot).
            self.floor *= max(ratio, 1.0)
            for i in range(N):
                if fitted[i]:
                    p[i][i] = max(p[i][i], spread(theta[i], self.floor))
            predicted = y
        # Relative errors: weigh the observation by 1 / its size.
        w = 1.0 / max(predicted, y, 1e-6)
        x = [xi * w for xi in x]
        error = (y - predicted) * w
        bound = clip * self.scale
        self.bias += 0.2 * (max(min(error, 1.0), -1.0) - self.bias)
        if self.n >= warm and abs(error) > bound and abs(self.bias) < bound:
            error = math.copysign(bound, error)  # an outlier moves the fit only so far
        self.scale += 0.05 * (min(abs(error), 2.0) - self.scale)
        self.scale = max(self.scale, 0.02)
        px = [sum(p[i][j] * x[j] for j in range(N)) for i in range(N)]
        denom = lam + sum(x[i] * px[i] for i in range(N))
        gain = [v / denom for v in px]
        for i in range(N):
            theta[i] += gain[i] * error
            for j in range(N):
                p[i][j] -= gain[i] * px[j]
        # Bounds the fit cannot find alone where queueing dominates (``core.speed``): the
        # prefill rate within ``band`` of its start, the overhead no more than the TTFTs show;
        # and none below nought.
        ttfts = self.ttfts
        high = [math.inf] * N
        if ttfts:
            high[0] = sorted(ttfts)[len(ttfts) // 10] / SCALE[0]
        low = [0.0] * N
        low[1], high[1] = self.anchor / band, self.anchor * band
        _bound(theta, p, low, high)
        if lam != 1.0:
            for i in range(N):
                for j in range(N):
                    p[i][j] /= lam
        # Forgetting inflates directions no observation excites: cap each variance at its
        # prior spread so a long run of look-alike requests cannot wind the gain up.
        for i in range(N):
            cap = spread(theta[i], self.floor) if fitted[i] else 0.0
            if p[i][i] > cap:
                r = math.sqrt(cap / p[i][i]) if cap > 0.0 else 0.0
                for j in range(N):
                    p[i][j] *= r
                    p[j][i] *= r
        self.n += 1
        self.speed = speed_of(theta)


def _bound(theta: list[float], p: list[list[float]], low: list[float], high: list[float]) -> None:
    """Hold ``theta`` within ``low``..``high``, each parameter held at its bound moving the
    others as the fit's covariance ``p`` says they go with it: clipped alone, the others
    keep the share of the step it was to take (decode's fall below nought, with requests
    running in a near constant count, taken up by the overhead), and a run of one sign
    winds them off (an overhead at 8x its worth, the prefill rate at half: uniform-mixed's
    A100s predicted +20%)."""
    for _ in range(N):
        worst, shift = -1, 0.0
        for i in range(N):
            t = theta[i]
            off = t - low[i] if t < low[i] else t - high[i] if t > high[i] else 0.0
            if off and abs(off) > abs(shift) and p[i][i] > 0.0:
                worst, shift = i, off
        if worst < 0:
            break
        pk = p[worst][worst]
        for j in range(N):
            theta[j] -= p[j][worst] / pk * shift
    for i in range(N):
        theta[i] = min(max(theta[i], low[i]), high[i])


def speed_of(theta: list[float]) -> Speed:
    return Speed(*(t * s for t, s in zip(theta, SCALE, strict=True)))


def theta_of(speed: Speed) -> tuple[float, ...]:
    return (speed.overhead_s, speed.prefill_s, speed.decode_s, speed.queue_s)


def spread(theta: float, floor: float = 0.05) -> float:
    """A parameter's prior variance: its own size (about 100% uncertain), with a floor."""
    return max(theta, floor) ** 2 * 4.0
