"""Per-RPC call counts, error counts, recent rates and latency percentiles for the draft server."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RpcSummary:
    method: str
    calls: int
    errors: int
    rate_per_s: float
    p50_ms: float
    p99_ms: float


class RpcMetrics:
    """Keeps the last ``window`` latencies per method (enough for stable p99 at serving rates)."""

    def __init__(self, window: int = 2048, rate_window_s: float = 10.0):
        self._lock = threading.Lock()
        self._window = window
        self._rate_window_s = rate_window_s
        self._calls: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        self._lat: dict[str, deque[float]] = {}
        self._stamps: dict[str, deque[float]] = {}
        self.started = time.monotonic()

    def observe(self, method: str, seconds: float, ok: bool) -> None:
        now = time.monotonic()
        with self._lock:
            self._calls[method] = self._calls.get(method, 0) + 1
            if not ok:
                self._errors[method] = self._errors.get(method, 0) + 1
            self._lat.setdefault(method, deque(maxlen=self._window)).append(seconds)
            self._stamps.setdefault(method, deque(maxlen=self._window)).append(now)

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
                    )
                )
        return out
