"""Thread-safe named counters: the mentor's per-gate, per-error and per-outcome counts."""

from __future__ import annotations

import threading
from collections import Counter


class Counts:
    """Counters shared by the guard, the backends and the pipeline.

    The async mentor writes hints in a background thread and the OpenAI backend counts from its
    request threads, so increments take a lock (`Counter[k] += 1` is not atomic).
    """

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def __getitem__(self, key: str) -> int:
        with self._lock:
            return self._counts[key]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def restore(self, counts: dict[str, int]) -> None:
        """Set the counts to a `snapshot` (a resumed run reports what the interrupted one counted)."""
        with self._lock:
            self._counts = Counter(counts)

    def drain(self) -> dict[str, int]:
        """Return the counts and reset them (per-step metrics)."""
        with self._lock:
            out = dict(self._counts)
            self._counts.clear()
            return out
