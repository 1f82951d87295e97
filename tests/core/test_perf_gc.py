"""``paused_gc``: the collector is off inside, its state restored after, and what the block
left alive is in the oldest generation (no young pass over it), cycles still collected;
``long_fold``: the same with a short switch interval, restored after."""

from __future__ import annotations

import gc
import weakref

from backfill.core.perf import paused_gc


class _Node:
    pass


def test_paused_gc_defers_and_restores_collection() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        kept = [[i] for i in range(50_000)]
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a garbage cycle made inside the block
        ref = weakref.ref(a)
        del a, b
    assert gc.isenabled()
    young = {id(o) for o in gc.get_objects(generation=0)}
    assert not any(id(x) in young for x in kept[::1000])  # moved on, not left for a young pass
    assert ref() is not None  # the cycle waits for a full collection...
    gc.collect()
    assert ref() is None  # ...which frees it


def test_paused_gc_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_freeze_heap_collects_garbage_then_leaves_live_objects_out_of_every_pass() -> None:
    from backfill.core.perf import freeze_heap

    live = [[i] for i in range(1000)]
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # garbage cycle: freed by the collection before the freeze
    ref = weakref.ref(a)
    del a, b
    before = len(gc.get_objects())
    try:
        n = freeze_heap()
        assert ref() is None
        # frozen objects still die by reference counting: another thread of the session may free
        # some between the two reads (a CI run: 318,033 then 318,025), none joins the frozen
        assert n >= len(live) and n - 1000 <= gc.get_freeze_count() <= n
        tracked = {id(o) for o in gc.get_objects()}  # every generation: the frozen ones are not in any
        assert not any(id(x) in tracked for x in live[::100])
        assert len(tracked) < before - len(live)
        after = [[0]]
        assert id(after[0]) in {id(o) for o in gc.get_objects(generation=0)}  # new objects are collected as before
    finally:
        gc.unfreeze()  # the rest of the test session as it was
    assert id(live[0]) in {id(o) for o in gc.get_objects()}


def test_paused_gc_keeps_a_frozen_heap_frozen() -> None:
    """``paused_gc`` thawed every frozen object on exit, the controller's start-up heap too."""
    from backfill.core.perf import freeze_heap

    try:
        frozen = freeze_heap()
        with paused_gc():
            kept = [[i] for i in range(100)]
        assert gc.get_freeze_count() >= frozen + len(kept)
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_long_fold_shortens_the_switch_interval_and_restores_it_also_on_error() -> None:
    import sys

    import pytest

    from backfill.core.perf import FOLD_SWITCH_INTERVAL, long_fold

    before = sys.getswitchinterval()
    assert before != FOLD_SWITCH_INTERVAL
    with pytest.raises(RuntimeError):
        with long_fold():
            assert not gc.isenabled()  # the collector paused as by paused_gc
            assert abs(sys.getswitchinterval() - FOLD_SWITCH_INTERVAL) < 1e-9
            raise RuntimeError("a fold that failed")
    assert gc.isenabled() and sys.getswitchinterval() == before


def test_overlapping_long_folds_restore_the_interval_the_process_had() -> None:
    # an adversarial trial: fold A enters, fold B enters (reading A's 0.2 ms), A ends, B ends:
    # the process was left at 0.2 ms for good
    import sys
    import threading

    from backfill.core.perf import FOLD_SWITCH_INTERVAL, long_fold

    before = sys.getswitchinterval()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[float] = []

    def fold_a() -> None:
        with long_fold():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def fold_b() -> None:
        a_in.wait(10)
        with long_fold():
            b_in.set()
            a_out.wait(10)
            seen.append(sys.getswitchinterval())  # A ended, B still folding: still short

    threads = [threading.Thread(target=fold_a), threading.Thread(target=fold_b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert abs(seen[0] - FOLD_SWITCH_INTERVAL) < 1e-6
    assert sys.getswitchinterval() == before


def test_long_fold_restores_a_custom_interval_to_the_microsecond_and_leaves_a_shorter_one() -> None:
    import sys

    from backfill.core.perf import long_fold

    before = sys.getswitchinterval()
    try:
        for custom in (0.0073, 0.000999, 1.0):
            sys.setswitchinterval(custom)
            read = sys.getswitchinterval()
            for _ in range(20):  # truncation to whole microseconds used to lose 1 us a round for some values
                with long_fold():
                    pass
            assert sys.getswitchinterval() == read
        sys.setswitchinterval(5e-7)  # below the interpreter's unit: reads back as 0.0
        with long_fold():
            assert sys.getswitchinterval() == 0.0  # already shorter: left alone
        assert sys.getswitchinterval() == 0.0  # and nothing raised on the way out
    finally:
        sys.setswitchinterval(before)
