"""Workloads and invariants shared by the fault tests: set a declaration running, check what
must hold after any fault, from the cluster's objects and the log only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from typing import Any

from .harness import JobPlayer, Kube, log_events, of_type, run_rows, wait_for

TEMPLATE = "model-eval-gauntlet"
#: A generous bound for "cancelled promptly" in a fault test (a fault test, not a benchmark).
CANCEL_BOUND_SECONDS = 5.0
#: How long after a fault a recorded-but-unconfirmed call must be carried out.
RECOVERY_BOUND_SECONDS = 5.0
JOB_APPEARS_SECONDS = 20.0


def declare(kube: Kube, names: list[tuple[str, str]], idle_for: str = "2s", node_per_model: bool = True) -> None:
    """The CronJob template, one Ready Model per (backfill, model) pair, and the ModelBackfills."""
    if kube.batch.list_namespaced_cron_job(kube.ns).items == []:
        kube.cronjob(TEMPLATE)
    models = sorted({m for _, m in names})
    for i, m in enumerate(models):
        if kube.get("models", m) is None:
            kube.model(m, node=f"node-{i}" if node_per_model else "node-a")
    for b, m in names:
        kube.backfill(b, model=m, template=TEMPLATE, idleFor=idle_for)


def post_reports(proc: Any, reports: list[dict], token: str = "t0ken", timeout: float = 10.0) -> tuple[int, dict, str | None]:
    """POST ``reports`` to the controller's ingest endpoint: ``(HTTP status, JSON answer,
    Retry-After)``; status 0 when the replica does not answer at all (the router tries the next)."""
    req = urllib.request.Request(
        f"http://{proc.address}/v1/foreground", data=json.dumps({"reports": reports}).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers.get("Retry-After")
    except OSError as exc:
        return 0, {"error": str(exc)}, "1"


def wait_job(kube: Kube, backfill: str, attempt: int | None = None, timeout: float = JOB_APPEARS_SECONDS) -> Any:
    """The (first) Job of ``backfill`` (of ``attempt`` if given), waited for."""
    def find() -> Any:
        for j in kube.jobs():
            if j.metadata.labels.get("modelbackfill.ai.flexinfer/name") != backfill:
                continue
            if attempt is None or j.metadata.name.endswith(f"-{attempt}"):
                return j
        return None

    return wait_for(find, timeout=timeout, what=f"a Job of {backfill}" + (f" attempt {attempt}" if attempt else ""))


def start_running(kube: Kube, player: JobPlayer, backfill: str, timeout: float = JOB_APPEARS_SECONDS) -> str:
    """Wait for the backfill's Job, play it running, wait for phase Running; returns the Job name."""
    job = wait_job(kube, backfill, timeout=timeout)
    name = job.metadata.name
    player.run(name)
    wait_for(lambda: kube.status(backfill).get("phase") == "Running", timeout=10, what=f"{backfill} Running")
    return name


def cluster_invariants(kube: Kube) -> list[str]:
    """What must hold in the cluster at any moment; returns the violations found (empty = fine).

    - every owned Job has a controller ownerReference to an existing ModelBackfill;
    - never two live (not Terminating, not finished) Jobs for one ModelBackfill;
    - at most one Job per attempt (job names are unique per attempt by construction, so two
      Jobs of one attempt would show as two Jobs with the same attempt suffix and owner).
    """
    problems: list[str] = []
    backfills = {
        o["metadata"]["uid"]: o["metadata"]["name"]
        for o in kube.custom.list_namespaced_custom_object("ai.flexinfer", "v1alpha2", kube.ns, "modelbackfills")["items"]
    }
    live: dict[str, list[str]] = defaultdict(list)
    per_attempt: Counter[tuple[str, str]] = Counter()
    for j in kube.jobs():
        owners = [o for o in j.metadata.owner_references or [] if o.controller]
        if not owners or owners[0].kind != "ModelBackfill":
            problems.append(f"Job {j.metadata.name} has no controller owner")
            continue
        if owners[0].uid not in backfills:
            problems.append(f"Job {j.metadata.name} is owned by a ModelBackfill that does not exist")
        per_attempt[(owners[0].uid, j.metadata.name.rsplit("-", 1)[-1])] += 1
        st = j.status
        done = st is not None and any(c.type in ("Complete", "Failed") and c.status == "True" for c in st.conditions or [])
        if j.metadata.deletion_timestamp is None and not done:
            live[owners[0].name].append(j.metadata.name)
    problems += [f"two Jobs for attempt {a} of {backfills.get(u, u)}" for (u, a), n in per_attempt.items() if n > 1]
    problems += [f"{b} has {len(js)} live Jobs: {js}" for b, js in live.items() if len(js) > 1]
    return problems


def settled_log_invariants(url: str, schema: str, *, all_ended: bool, timeout: float = 5.0) -> list[str]:
    """:func:`log_invariants` once the controller has caught up: run rows are written by the loop's
    next pass after an admission, so a check made just after a Job appeared may precede its row.
    Polls until no violation or ``timeout`` seconds; returns the last violations."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        found = log_invariants(url, schema, all_ended=all_ended)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def log_invariants(url: str, schema: str, *, all_ended: bool) -> list[str]:
    """What must hold in the log and the runs table; returns the violations.

    - every admission (namespace, backfill, attempt) is recorded once, every cancel once;
    - every admitted attempt has exactly one run row; with ``all_ended`` each has its end.
    """
    events = log_events(url, schema)
    problems: list[str] = []
    admitted = Counter((e.namespace, e.backfill, e.attempt) for _, e in of_type(events, "AttemptAdmitted"))
    cancelled = Counter((e.namespace, e.backfill, e.attempt) for _, e in of_type(events, "AttemptCancelled"))
    problems += [f"attempt {k} admitted {n} times" for k, n in admitted.items() if n > 1]
    problems += [f"attempt {k} cancelled {n} times" for k, n in cancelled.items() if n > 1]
    rows = run_rows(url, schema)
    per = Counter((r.namespace, r.backfill, r.attempt) for r in rows)
    problems += [f"run row {k} stored {n} times" for k, n in per.items() if n > 1]
    problems += [f"admitted attempt {k} has no run row" for k in admitted if k not in per]
    if all_ended:
        problems += [f"run row {(r.namespace, r.backfill, r.attempt)} has no end" for r in rows if r.ended_at is None or r.result is None]
    return problems
