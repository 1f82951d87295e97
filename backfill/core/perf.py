"""The cyclic garbage collector: paused around long folds, the start-up heap frozen.

Folding allocates many short-lived, acyclic tuples; the collector's generation-0 passes then cost
about a third of a replay and more when the process already holds large results. Nothing in the
projection forms reference cycles, so pausing it is safe; reference counting still frees memory.

A long-running controller holds about 250,000 tracked objects once started, nearly all of them
the imported code (the Kubernetes client's models, pydantic's schemas) and the start-up state.
Every full collection traverses them all while holding the interpreter lock: measured 85-155 ms
each on the 2-core machine, a stall of every thread, the cancel path included, several times a
minute under load. :func:`freeze_heap` takes them out of the collector's passes once.
"""

from __future__ import annotations

import gc
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator

#: The interpreter's switch interval inside :func:`long_fold`, seconds (Python's default: 0.005).
FOLD_SWITCH_INTERVAL = 0.0002


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state on exit (also on error).

    On exit the objects the block left alive join the oldest generation (``gc.freeze`` then
    ``gc.unfreeze``), as they would have by surviving collections: no generation-0 pass over all
    of them right after the block (measured: 0.2-0.3 s after a whole-trace ``simulate``). A
    garbage cycle made inside is collected by the next full collection. In a process whose heap
    was frozen (:func:`freeze_heap`) they stay frozen with it: ``gc.unfreeze`` cannot thaw only
    the block's objects, and thawing the start-up heap would undo the freeze.
    """
    was = gc.isenabled()
    heap_frozen = gc.get_freeze_count() > 0
    gc.disable()
    try:
        yield
    finally:
        if was:
            # Everything allocated meanwhile is young: enabling the collector as is makes the next
            # allocation traverse all of it (a generation-0 pass over the whole result). Move it
            # to the oldest generation first, where a surviving object would end up anyway.
            gc.freeze()
            gc.enable()
            if not heap_frozen:
                gc.unfreeze()


def freeze_heap() -> int:
    """Collect garbage once, then move every object alive now to the collector's permanent
    generation (``gc.freeze``): later collections, the full ones included, traverse only what
    was allocated afterwards. Called once by ``backfill controller`` when its watchers have
    synced (the imports and the start-up state are then in place).

    Frozen objects are still freed by reference counting; only a reference cycle among them
    that becomes garbage later is never collected (a bounded, one-time cost: they are the
    start-up heap). Returns the number of frozen objects (``gc.get_freeze_count()``).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def long_fold(switch_interval: float = FOLD_SWITCH_INTERVAL) -> Iterator[None]:
    """The block folds a long stretch of the log read from the store (start-up, ``backfill
    replay``): the collector paused (:func:`paused_gc`) and the interpreter's switch interval
    (``sys.setswitchinterval``, seconds) at most ``switch_interval`` (Python's default is 5 ms).

    Why the switch interval: :meth:`backfill.store.EventStore.read_payloads` reads the next batch
    on a helper thread while this one folds, and that thread needs the interpreter lock for each
    chunk it takes off the socket (a Unix socket holds about 200 kB, a tenth of a batch). With
    the default it waits up to 5 ms for the lock each time while the server, its send buffer
    full, waits for it: the read hardly overlaps the fold (``python -m bench --only replay``,
    the row "switch interval": 1.26x on 2026-12-05, BENCHMARKS.md). Other threads (the watchers,
    the cancel path) also get the lock sooner meanwhile; the fold pays a few more switches.

    Folds that overlap in one process (threads, two embedded controllers) share the setting:
    the interval the process had before the first of them is restored, to the microsecond (the
    interpreter's unit), when the last one ends (an adversarial trial found the interval left at
    0.2 ms after two overlapping folds, and 1 us lost per restore). An interval already at or
    below ``switch_interval`` is left alone. Restoring never raises.
    """
    with _SWITCH_LOCK:
        if _SWITCH["folds"] == 0:
            before = sys.getswitchinterval()
            _SWITCH["before"] = before if before > switch_interval else None
        _SWITCH["folds"] += 1
        if _SWITCH["before"] is not None and sys.getswitchinterval() > switch_interval:
            sys.setswitchinterval(switch_interval)
    try:
        with paused_gc():
            yield
    finally:
        with _SWITCH_LOCK:
            _SWITCH["folds"] -= 1
            if _SWITCH["folds"] == 0 and _SWITCH["before"] is not None:
                # The interpreter keeps whole microseconds, truncating: half a microsecond more
                # makes the value read on entry come back exactly.
                sys.setswitchinterval((round(_SWITCH["before"] * 1e6) + 0.5) / 1e6)


#: The folds inside :func:`long_fold` now, and the switch interval to restore after the last.
_SWITCH: dict[str, Any] = {"folds": 0, "before": None}
_SWITCH_LOCK = threading.Lock()
