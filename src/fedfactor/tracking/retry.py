"""The guard around every store call: tracking never loses training.

Any exception a store call raises is retried with jittered exponential backoff for up to
RETRY_SECONDS; then the call raises _Unreachable, on which the tracker logs one warning, switches
itself off and training goes on. `fedfactor mlflow-import` loads the files later.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Total seconds one store call may keep failing (retried with backoff) before the tracker gives up.
RETRY_SECONDS = 25.0
_BACKOFF_FIRST = 0.1
_BACKOFF_MAX = 4.0


class _Unreachable(Exception):
    """A store call still failing after the retries; its message is the one-line reason."""


class _Fatal(Exception):
    """A store problem that no retry fixes (a deleted experiment): give up at once."""


def _one_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _retry(call: Callable[[], T]) -> T:
    """The guard around every store call: retry any exception with jittered exponential backoff
    until RETRY_SECONDS have passed, then raise _Unreachable with the last error as one line."""
    deadline = time.monotonic() + RETRY_SECONDS
    delay = _BACKOFF_FIRST
    while True:
        try:
            return call()
        except _Fatal as e:
            raise _Unreachable(str(e)) from e
        except Exception as e:  # a locked database, a refused connection, a half-migrated schema...
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Unreachable(_one_line(e)) from e
            time.sleep(min(remaining, delay * (0.5 + random.random())))
            delay = min(2 * delay, _BACKOFF_MAX)
