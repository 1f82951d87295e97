"""Property tests of resumable Indexed Jobs (issue 11): random demand, gates, spec changes and
Job facts driven through the projector like a controller and a Job controller would.

Checked independently of the code under test: no admission or resume before the idle window
(from the raw log), never a second Job while one is suspended, every verdict an event changes is
among the keys ``affected`` names, replay re-derives every decision, and the run rows count each
completed index once with ``useful + wasted == running``.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from backfill.core import events as ev
from backfill.core import indexes
from backfill.core.audit import Auditor
from backfill.core.commands import Admit, Cancel, Resume
from backfill.core.decide import evaluate
from backfill.core.decisions import decision_record
from backfill.core.projector import affected, decide, fold
from backfill.core.runs import run_rows
from backfill.core.state import World

from .builders import NS, TEMPLATE, t

IDLE_FOR = 60.0
SHARDS = 3
INDEXED = {"spec": {"completionMode": "Indexed", "completions": SHARDS, "parallelism": 1, **TEMPLATE["spec"]}}
NAMES = ("b1", "b2")

steps = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=90, allow_nan=False),
        st.sampled_from(
            ["request", "request", "gaming", "gaming_end", "notready", "ready", "respec", "tick", "tick",
             "jobs", "jobs", "jobs", "jobs", "foreign_delete", "foreign_resume"]
        ),
        st.integers(min_value=0, max_value=20),
    ),
    max_size=60,
)


def run(script):
    """Returns (log of events, [(now, command, log length when decided)])."""
    world = World()
    log: list = []
    done: dict[str, int] = {}  # job -> shards completed (the Job controller's own count)

    def add(e):
        nonlocal world
        log.append(e)
        world = fold(world, e, len(log))

    add(ev.CronJobSeen(at=t(0), namespace=NS, name="cj", job_template=INDEXED))
    add(ev.ModelReady(at=t(0), namespace=NS, model="m", node="n0"))
    gens = {}
    for name in NAMES:
        gens[name] = 1
        add(ev.BackfillApplied(at=t(0), namespace=NS, name=name, uid=f"u-{name}", generation=1,
                               spec={"modelRef": "m", "templateRef": "cj", "idleFor": "1m", "preemption": "Suspend"}))
    now = 0.0
    decisions = []
    for dt, kind, arg in script:
        now += dt
        at = t(now)
        if kind == "request":
            add(ev.ForegroundRequest(at=at, namespace=NS, model="m", busy_until=t(now + arg % 5)))
        elif kind == "gaming":
            add(ev.GamingIntentStarted(at=at, namespace=NS, session="g", node="n0"))
        elif kind == "gaming_end":
            add(ev.GamingIntentEnded(at=at, namespace=NS, session="g"))
        elif kind == "notready":
            add(ev.ModelNotReady(at=at, namespace=NS, model="m", node="n0"))
        elif kind == "ready":
            add(ev.ModelReady(at=at, namespace=NS, model="m", node="n0"))
        elif kind == "respec":
            name = NAMES[arg % 2]
            gens[name] += 1
            add(ev.BackfillApplied(at=at, namespace=NS, name=name, uid=f"u-{name}", generation=gens[name],
                                   spec={"modelRef": "m", "templateRef": "cj", "idleFor": "1m",
                                         "preemption": "Suspend" if arg % 3 else "Delete"}))
        for b in list(world.backfills.values()):
            a = b.attempt
            if a is None:
                continue
            job = dict(namespace=NS, backfill=b.name, name=a.job_name)
            if kind == "jobs":  # the Job controller's turn: progress, stop, resume, finish
                if a.lifecycle == "Running":
                    n = min(SHARDS, done.get(a.job_name, 0) + 1 + arg % 2)
                    done[a.job_name] = n
                    if n == SHARDS:
                        add(ev.JobSucceeded(at=at, completed_indexes=f"0-{SHARDS - 1}", **job))
                    else:
                        add(ev.JobProgress(at=at, completed_indexes=f"0-{n - 1}", active=1, **job))
                elif a.lifecycle == "Suspending":
                    n = done.get(a.job_name, 0)
                    add(ev.JobSuspended(at=at, completed_indexes=f"0-{n - 1}" if n else "", episode=f"rv{len(log)}", **job))
                elif a.lifecycle == "Starting" and a.segment > 1:
                    add(ev.JobResumed(at=at, episode=f"t{len(log)}", **job))
                elif a.lifecycle == "Cancelling":
                    add(ev.JobDeleted(at=at, **job))
            elif kind == "foreign_delete" and a.suspended and arg % 2:
                add(ev.JobDeleted(at=at, **job))
            elif kind == "foreign_resume" and a.suspended:
                add(ev.JobResumed(at=at, episode=f"h{len(log)}", **job))
        basis = world.position  # every decision of one decide call was made on this world
        for c in decide(world, at):
            decisions.append((now, c, len(log)))
            if isinstance(c, (Admit, Cancel, Resume)):
                e, _ = decision_record(c, at=at, basis=basis)
                add(e)
                if isinstance(c, Admit):
                    add(ev.JobCreated(at=at, namespace=NS, backfill=c.key[1], name=c.job_name))
                    add(ev.JobRunning(at=at, namespace=NS, backfill=c.key[1], name=c.job_name))
    return log, decisions


@settings(max_examples=400, deadline=None)
@given(steps)
# CI: a suspended attempt deleted for a spec change and a contender admitted in the same decide
# call; the harness recorded the admission with the basis *after* the cancel it had just added
@example([(60.0, "gaming_end", 0), (0.0, "request", 0), (0.0, "jobs", 0), (60.0, "respec", 0)])
def test_resumable_runs_keep_every_rule(script):
    log, decisions = run(script)

    # 1. admissions and resumes only after a full idle window (busy ends and Ready, from the raw log)
    for now, c, seen in decisions:
        if not isinstance(c, (Admit, Resume)):
            continue
        before = log[:seen]
        busy = [e.busy_until or e.at for e in before if isinstance(e, ev.ForegroundRequest)]
        gaming_ends, playing = [], False  # the end of a session that was on (an end alone is nothing)
        for e in before:
            if isinstance(e, ev.GamingIntentStarted):
                playing = True
            elif isinstance(e, ev.GamingIntentEnded) and playing:
                gaming_ends.append(e.at)
                playing = False
        if playing:
            raise AssertionError(f"{c} while gaming intent holds")
        for end in busy + gaming_ends:
            assert t(now) >= end + (t(IDLE_FOR) - t(0)), (c, end)

    # 2. never a new Job while the backfill's Job is suspended (only a resume continues it)
    world = World()
    for pos, e in enumerate(log, 1):
        if isinstance(e, ev.AttemptAdmitted):
            b = world.backfills[(e.namespace, e.backfill)]
            assert b.attempt is None or not (b.attempt.live or b.attempt.suspended), e
        world = fold(world, e, pos)

    # 3. every verdict an event changes is among the keys affected() names
    world = World()
    for pos, e in enumerate(log, 1):
        sig = lambda w, k: (lambda v: None if v is None else (v.phase, v.reason, tuple(type(x).__name__ for x in v.commands)))(evaluate(w, k, e.at))  # noqa: E731
        before = {k: sig(world, k) for k in world.backfills}
        world = fold(world, e, pos)
        woken = set(affected(world, e))
        changed = {k for k in world.backfills if sig(world, k) != before.get(k)}
        assert changed <= woken, (type(e).__name__, pos)

    # 4. replay re-derives every recorded decision
    auditor = Auditor()
    for pos, e in enumerate(log, 1):
        auditor.feed(pos, e)
    assert auditor.divergences == [] and auditor.unverifiable == []

    # 5. run rows: each completed index counted once per Job; useful + wasted == running
    world, rows = World(), {}
    for pos, e in enumerate(log, 1):
        before, world = world, fold(world, e, pos)
        for r in run_rows(before, world, e):
            rows[r.identity] = r
    per_job: dict[str, int] = {}
    for r in rows.values():
        per_job[r.job_name] = per_job.get(r.job_name, 0) + indexes.count_text(r.completed_indexes)
        assert abs(r.useful_seconds + r.wasted_seconds - (r.running_seconds if r.result else 0.0)) < 1e-6
        assert 0 <= r.useful_seconds <= r.running_seconds + 1e-9
    final: dict[str, int] = {}
    for e in log:
        if isinstance(e, (ev.JobProgress, ev.JobSucceeded, ev.JobSuspended)) and e.completed_indexes:
            final[e.name] = max(final.get(e.name, 0), indexes.count_text(e.completed_indexes))
    for job, n in per_job.items():
        assert n <= final.get(job, 0), job
