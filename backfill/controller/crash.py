"""Test hook: kill this process right after a named step (the fault suite's crash points).

``BACKFILL_CRASH_AT=<step>`` makes :func:`crash_point` SIGKILL the process right after that step;
with ``BACKFILL_CRASH_ONCE_FILE=<path>`` the file is created first and a process that finds it
runs through (so the restarted controller does not crash again). Unset, a call costs one string
comparison. Steps (tests/faults/test_crashes.py): ``admit/decision-appended``,
``admit/create-sent`` (just before the POST), ``admit/create-answered``,
``admit/jobcreated-appended`` (the observation handed to the spool), ``admit/runrow-written``,
``admit/status-written``, ``cancel/decision-appended`` (the decision handed to the spool),
``cancel/delete-sent``, ``cancel/delete-answered``, ``cancel/runrow-written``,
``cancel/status-written`` (the first status written after the cancel call was answered: a
Cancelling one, or the next phase when the Job went at once and the Cancelling one was never
written, one CI run).
"""

from __future__ import annotations

import os
import signal

_STEP = os.environ.get("BACKFILL_CRASH_AT")
_ONCE = os.environ.get("BACKFILL_CRASH_ONCE_FILE")


def crash_point(step: str) -> None:
    """SIGKILL this process if ``BACKFILL_CRASH_AT`` names ``step`` (see the module docstring)."""
    if _STEP is None or _STEP != step or (_ONCE and os.path.exists(_ONCE)):
        return
    if _ONCE:
        open(_ONCE, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


def crash_armed(step: str) -> bool:
    """True if ``BACKFILL_CRASH_AT`` names ``step`` (for a hook that needs bookkeeping first)."""
    return _STEP == step
