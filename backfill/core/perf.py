"""Pausing the cyclic garbage collector around long folds.

Folding allocates many short-lived, acyclic tuples; the collector's generation-0 passes then cost
about a third of a replay and more when the process already holds large results. Nothing in the
projection forms reference cycles, so pausing it is safe; reference counting still frees memory.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block; restore its previous state on exit (also on error)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
