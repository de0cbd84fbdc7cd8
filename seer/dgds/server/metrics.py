"""Per-RPC call counts, error counts, recent rates and latency percentiles for the draft server."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

_BUCKET_GROWTH = 1.05  # histogram bucket k holds latencies in [1 us * 1.05**k, 1 us * 1.05**(k+1))
_LOG_GROWTH = math.log(_BUCKET_GROWTH)


@dataclass(frozen=True)
class RpcSummary:
    method: str
    calls: int
    errors: int
    rate_per_s: float
    p50_ms: float
    p99_ms: float
    total_p50_ms: float = 0.0
    total_p99_ms: float = 0.0
    max_ms: float = 0.0


def _bucket(seconds: float) -> int:
    return max(0, int(math.log(max(seconds, 1e-6) * 1e6) / _LOG_GROWTH))


def _hist_percentile(hist: dict[int, int], q: float) -> float:
    """The upper edge of the bucket holding the q-th percentile, in ms (at most 5% high)."""
    total = sum(hist.values())
    rank = q / 100 * total
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen >= rank:
            return 1e-3 * _BUCKET_GROWTH ** (k + 1)
    return 0.0


class RpcMetrics:
    """Keeps the last ``window`` latencies per method (enough for stable p99 at serving rates), and
    a histogram of all of them since the start (percentiles of a whole benchmark run)."""

    def __init__(self, window: int = 2048, rate_window_s: float = 10.0):
        self._lock = threading.Lock()
        self._window = window
        self._rate_window_s = rate_window_s
        self._calls: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._lat: dict[str, deque[float]] = {}
        self._stamps: dict[str, deque[float]] = {}
        self._hist: dict[str, dict[int, int]] = {}
        self._max: dict[str, float] = {}
        self.started = time.monotonic()

    def observe(self, method: str, seconds: float, ok: bool) -> None:
        now = time.monotonic()
        with self._lock:
            self._calls[method] = self._calls.get(method, 0) + 1
            if not ok:
                self._errors[method] = self._errors.get(method, 0) + 1
            self._lat.setdefault(method, deque(maxlen=self._window)).append(seconds)
            self._stamps.setdefault(method, deque(maxlen=self._window)).append(now)
            hist = self._hist.setdefault(method, {})
            k = _bucket(seconds)
            hist[k] = hist.get(k, 0) + 1
            if seconds > self._max.get(method, 0.0):
                self._max[method] = seconds

    def summary(self) -> list[RpcSummary]:
        now = time.monotonic()
        out = []
        with self._lock:
            for method in sorted(self._calls):
                lat = sorted(self._lat[method])
                recent = [t for t in self._stamps[method] if now - t <= self._rate_window_s]
                span = min(self._rate_window_s, max(now - self.started, 1e-9))
                out.append(
                    RpcSummary(
                        method,
                        self._calls[method],
                        self._errors.get(method, 0),
                        len(recent) / span,
                        1e3 * lat[len(lat) // 2],
                        1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
                        _hist_percentile(self._hist[method], 50),
                        _hist_percentile(self._hist[method], 99),
                        1e3 * self._max[method],
                    )
                )
        return out
