"""An observation PostgreSQL refuses never stalls the controller (before: one such record stayed
at the spool's head, every later append failed and no ModelBackfill anywhere was admitted again
until a restart), and the admissions it may affect wait for it (fail-closed).

On the real apiserver and PostgreSQL: the controller's store is wrapped so that the records of
one Model's ``lastActiveTime`` demand carry a NUL in their data while ``poison`` is set (an
encoding that let one through, as before ``backfill.core.storable``); PostgreSQL itself refuses
them (``UntranslatableCharacter``)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from msgspec.structs import replace

from backfill.core import events as ev
from backfill.core.audit import Auditor

from .conftest import log_of, now_s, ts, wait_for

pytestmark = pytest.mark.kube


class PoisoningStore:
    """The controller's EventStore; while ``poison`` is set, a ForegroundRequest record of
    ``stream`` is given a NUL in its data before PostgreSQL sees it."""

    def __init__(self, store: Any, poison: threading.Event, stream: str) -> None:
        self._store, self._poison, self._stream = store, poison, stream

    def append(self, records: Any) -> Any:
        if self._poison.is_set():
            records = [
                replace(r, data=r.data[:-1] + ',"x":"\\u0000"}') if r.type == "ForegroundRequest" and r.stream == self._stream else r
                for r in records
            ]
        return self._store.append(records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _jobs_of(kube, backfill: str) -> list[str]:
    return [j.metadata.name for j in kube.jobs() if j.metadata.name.startswith(f"{backfill}-")]


def test_a_refused_demand_holds_only_its_models_admissions_and_the_log_goes_on(kube, start_controller):
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    kube.model("other", node="node-b")
    poison = threading.Event()
    poison.set()
    controller = start_controller(
        wrap_events=lambda s: PoisoningStore(s, poison, f"model/{kube.ns}/gemma"), foreground_signal_granularity_seconds=0
    )
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})  # a demand the log refuses
    wait_for(lambda: controller.spool.refused == 1, timeout=10, what="the demand refused and set aside")

    kube.backfill("bf-gemma", model="gemma")
    kube.backfill("bf-other", model="other")
    # The log still takes appends: the other Model's declaration is admitted after its 2 s window.
    wait_for(lambda: _jobs_of(kube, "bf-other"), timeout=20, what="bf-other's Job")
    # gemma's admission is due too (its log shows no demand) but waits: the refused demand may matter.
    st = wait_for(lambda: (s := kube.status("bf-gemma")).get("reason") == "UnstorableEvent" and s, timeout=10, what="bf-gemma held")
    assert st["phase"] == "WaitingForIdle"
    assert f"the event log refused ForegroundRequest of model/{kube.ns}/gemma" in st["message"]
    time.sleep(3)  # more than its idle window again: still nothing
    assert _jobs_of(kube, "bf-gemma") == []
    log = [e for _, e in log_of(controller)]
    assert [e.model for e in log if isinstance(e, ev.ForegroundRequest)] == []
    assert [e.backfill for e in log if isinstance(e, ev.AttemptAdmitted)] == ["bf-other"]

    # A later demand of the same Model that the log takes replaces the refused one: gemma is
    # admitted a full idle window (2 s) after it.
    poison.clear()
    later = now_s() + timedelta(seconds=1)
    kube.set_status("models", "gemma", {"lastActiveTime": ts(later)})
    wait_for(lambda: _jobs_of(kube, "bf-gemma"), timeout=20, what="bf-gemma's Job once a demand is stored")
    log = [e for _, e in log_of(controller)]
    (stored,) = [e for e in log if isinstance(e, ev.ForegroundRequest)]
    (admitted,) = [e for e in log if isinstance(e, ev.AttemptAdmitted) and e.backfill == "bf-gemma"]
    assert stored.at == later and admitted.at >= later + timedelta(seconds=2)
    assert controller.spool.refused == 1 and controller.spool.doubts() == []


def test_a_refused_demand_still_cancels_and_the_next_admission_waits_for_a_stored_one(kube, start_controller, pg_schema):
    """Stopping is fail-safe: the cancel is made from memory whatever the log does with the
    demand; the next admission then waits until a demand of that Model is stored."""
    kube.cronjob("model-eval-gauntlet")
    kube.model("gemma")
    poison = threading.Event()
    controller = start_controller(
        wrap_events=lambda s: PoisoningStore(s, poison, f"model/{kube.ns}/gemma"), foreground_signal_granularity_seconds=0
    )
    kube.backfill("bf", model="gemma")
    (job,) = wait_for(lambda: _jobs_of(kube, "bf"), timeout=20, what="bf's Job")
    kube.run_job(job)
    wait_for(lambda: kube.status("bf").get("phase") == "Running", timeout=10, what="bf Running")

    poison.set()
    kube.set_status("models", "gemma", {"lastActiveTime": ts(now_s())})
    wait_for(lambda: kube.job_going(job), timeout=5, what="the Job deleted for the refused demand")
    wait_for(lambda: controller.spool.refused == 1, timeout=10, what="the demand set aside")
    st = wait_for(lambda: (s := kube.status("bf")).get("reason") == "UnstorableEvent" and s, timeout=15, what="bf held")
    assert st["phase"] == "WaitingForIdle" and [j for j in _jobs_of(kube, "bf") if j != job] == []
    pairs = log_of(controller)
    ((at, cancel),) = [(p, e) for p, e in pairs if isinstance(e, ev.AttemptCancelled)]
    assert cancel.reason == "ForegroundDemand" and [e for _, e in pairs if isinstance(e, ev.ForegroundRequest)] == []
    # Its cause is not in the log: 0, and the replay does not check it (nor call it divergent).
    assert cancel.cause == 0
    auditor = Auditor()
    auditor.feed_many(pairs)
    assert (auditor.uncaused, auditor.divergences) == ([at], [])
    url, schema = pg_schema
    out = subprocess.run(
        [sys.executable, "-m", "backfill.cli", "replay", "--database-url", url, "--schema", schema],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0 and "no divergence" in out.stdout, out.stderr
    assert f"1 with a cause the log refused to store (cause 0: not checked; the controller's log holds the refused record), at {at}" in out.stderr
    assert "cancel (cause refused)" in out.stdout

    poison.clear()
    later = now_s() + timedelta(seconds=1)
    kube.set_status("models", "gemma", {"lastActiveTime": ts(later)})
    wait_for(lambda: [j for j in _jobs_of(kube, "bf") if j != job], timeout=20, what="the next attempt's Job")
    log = [e for _, e in log_of(controller)]
    admitted = [e for e in log if isinstance(e, ev.AttemptAdmitted)]
    assert [a.attempt for a in admitted] == [1, 2] and admitted[1].at >= later + timedelta(seconds=2)
