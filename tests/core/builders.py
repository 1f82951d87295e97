"""Small builders for projector tests: a clock in seconds and a log that folds as it grows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from backfill.core import events as ev
from backfill.core.projector import decide, fold
from backfill.core.state import World

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)
NS = "flexinfer-system"
TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def t(seconds: float) -> datetime:
    """T0 + seconds."""
    return T0 + timedelta(seconds=seconds)


class Log:
    """An event log folded as it grows; ``world`` is the projection, ``events`` the (pos, event) list."""

    def __init__(self) -> None:
        self.world = World()
        self.events: list[tuple[int, object]] = []

    def add(self, event) -> "Log":
        pos = len(self.events) + 1
        self.events.append((pos, event))
        self.world = fold(self.world, event, pos)
        return self

    def decide(self, at: float, keys=None):
        return decide(self.world, t(at), keys)

    # shorthands -------------------------------------------------------------------------
    def ready(self, at=0, model="m", node="n1", shared="", uid=""):
        return self.add(ev.ModelReady(at=t(at), namespace=NS, model=model, node=node, shared=shared, uid=uid))

    def not_ready(self, at, model="m", node="n1", uid=""):
        return self.add(ev.ModelNotReady(at=t(at), namespace=NS, model=model, phase="Loading", node=node, uid=uid))

    def cronjob(self, at=0, name="cj", template=None):
        return self.add(ev.CronJobSeen(at=t(at), namespace=NS, name=name, job_template=template or TEMPLATE))

    def apply(self, at=0, name="b", model="m", gen=1, uid="u1", **spec):
        s = {"modelRef": model, "templateRef": "cj", "idleFor": "10m", "maxRunDuration": "15m"}
        s.update(spec)
        return self.add(ev.BackfillApplied(at=t(at), namespace=NS, name=name, uid=uid, generation=gen, spec=s))

    def request(self, at, model="m", busy=None):
        return self.add(
            ev.ForegroundRequest(at=t(at), namespace=NS, model=model, busy_until=t(busy) if busy is not None else None)
        )

    def admit(self, cmd, at, basis=None):
        """Record ``cmd`` (an Admit) as the controller does, decided on the state at ``basis``
        (default: the position just before this record)."""
        return self._decision(cmd, at, basis)

    def cancel(self, cmd, at, basis=None):
        """Record ``cmd`` (a Cancel) as the controller does (see :meth:`admit`)."""
        return self._decision(cmd, at, basis)

    def _decision(self, cmd, at, basis):
        from backfill.core.decisions import decision_record

        e, _key = decision_record(cmd, at=t(at), basis=self.world.position if basis is None else basis)
        return self.add(e)

    def job(self, kind, name, at, backfill="b", **kw):
        cls = getattr(ev, kind)
        return self.add(cls(at=t(at), namespace=NS, backfill=backfill, name=name, uid=f"uid-{name}", **kw))


def run_rows_of(log: Log) -> list:
    """The run rows the log's events produce, last version of each (the loop's upserts), in
    identity order."""
    from backfill.core.runs import run_rows

    world, rows = World(), {}
    for pos, e in log.events:
        before, world = world, fold(world, e, pos)
        for r in run_rows(before, world, e):
            rows[r.identity] = r
    return [rows[k] for k in sorted(rows)]


def running(idle: float = 600.0) -> tuple[Log, Any]:
    """The builders' declaration (idleFor 10m) admitted at ``idle`` seconds, its Job created and
    running (uid ``uid-<job name>``); returns ``(log, the Admit)``."""
    from backfill.core.commands import Admit

    log = Log().ready(0).cronjob(0).apply(0)
    admit = next(c for c in log.decide(idle) if isinstance(c, Admit))
    log.admit(admit, idle)
    log.job("JobCreated", admit.job_name, idle).job("JobRunning", admit.job_name, idle)
    return log, admit
