"""Benchmark: foreground demand -> Job DELETE latency on a real kube-apiserver (issue 4, "Speed").

Usage::

    .venv/bin/python bench/bench_latency.py [--models N] [--samples N] [--burst N] [--group N]
                                            [--gap SECONDS] [--resync SECONDS] [--database-url URL]

One run, side by side:

- **floor**: a minimal reference controller on the same apiserver: one watch on the Models, and
  on a ``lastActiveTime`` change one Job DELETE (``propagationPolicy=Background``) of the Job it
  already knows. Nothing is faster than this on this apiserver and machine; "ours / floor" is the
  overhead of everything the real controller does besides. For the burst it runs twice: as
  above (one DELETE at a time, from its watch thread), and as a **parallel floor** that sends
  its DELETEs on as many threads as the controller's job-deletes pool
  (``backfill.controller.actor.DELETE_WORKERS``), the least any controller can do with a burst;
  the burst rows' baseline is the parallel floor.
- **ours**: the in-process :class:`backfill.controller.loop.Controller` (no leader election, a
  fresh PostgreSQL schema) over ``--models`` Models and as many ModelBackfills in namespace
  ``bench-ours``; ``--suspend`` of them declare ``preemption: Suspend`` on an Indexed template
  (issue 11), and their samples are shuffled into the paced ones: the same run and method
  measure demand -> the Job's ``spec.suspend: true`` PATCH accepted beside demand -> DELETE. Every ModelBackfill is admitted (its Job created, then marked running the way
  the Job controller would), then ``--samples`` sampled Models get ``status.lastActiveTime = now``
  through the status subresource, a few at a time at random intervals; optionally a burst of
  ``--burst`` more Models all at once. Then the same again **with PostgreSQL stopped** (embedded
  server only: ``pg_ctl stop``; the cancel path must not notice), after which the server is
  started again, the controller's spool drains, and the log is audited (``backfill replay``'s
  auditor: divergences are printed).
- **baseline**: the upstream behaviour, a poller that every 5 s lists the Models and the backfill
  Jobs and deletes (``propagationPolicy=Background``) the Job of every Model whose
  ``lastActiveTime`` moved since the previous poll. The floor and the baseline run in namespace
  ``bench-base`` (``--models`` Models and Jobs of their own, which our controller does not watch;
  disjoint samples) after our controller stopped, on the same kind of samples.

The latency of one sample is from the Model status PATCH being accepted to the Job DELETE being
accepted, both taken from the apiserver's own audit log (``stageTimestamp`` of stage
``ResponseComplete``; same clock, server side; the PATCH is matched by its ``Audit-Id`` response
header). A client-side measure (PATCH call returned -> the bench's Job watch saw ``DELETED``) is
printed next to it as a cross-check. A third table shows where the controller's reconcile thread
spent its time during the paced samples (a few controller methods wrapped with timers at run
time; the controller's code is unchanged). No assertions: the table shows the targets
(issue 8: p50 <= 10 ms, p99 <= 30 ms, burst p99 <= 100 ms; baseline/ours >= 50x) and whether they
are met, with the ratio to the floor.

The embedded PostgreSQL server (``BACKFILL_DATA_DIR``, default ``.backfill``) is used unless
``--database-url`` / ``BACKFILL_DATABASE_URL`` is set; the scratch schema is dropped at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from backfill.controller.actor import DELETE_WORKERS  # noqa: E402
from backfill.core.perf import freeze_heap  # noqa: E402
from bench.rows import Row  # noqa: E402

GROUP, VERSION = "ai.flexinfer", "v1alpha2"
BACKFILL_LABEL = "modelbackfill.ai.flexinfer/name"
NS_OURS, NS_BASE = "bench-ours", "bench-base"
TEMPLATE = "bench-template"
TEMPLATE_INDEXED = "bench-template-indexed"  # the resumable declarations' (issue 11)
BASELINE_INTERVAL = 5.0  # upstream's poll period, seconds
TARGET_P50_MS = 10.0
TARGET_P99_MS = 30.0
TARGET_BURST_P99_MS = 100.0
TARGET_RATIO = 50.0

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    verbs: ["create", "delete", "patch"]
    resources:
      - group: "batch"
        resources: ["jobs", "cronjobs"]
  - level: Metadata
    verbs: ["patch", "update"]
    resources:
      - group: "ai.flexinfer"
        resources: ["models/status"]
  - level: None
"""

console = Console(width=150)


def say(msg: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {msg}")


def ts(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def model_name(i: int) -> str:
    return f"m-{i:05d}"


def backfill_name(i: int) -> str:
    return f"bf-{i:05d}"


def header(headers: Any, name: str) -> str | None:
    for k, v in (headers or {}).items():
        if k.lower() == name.lower():
            return v
    return None


def pctl(data: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0..100), linear interpolation between closest ranks."""
    s = sorted(data)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# --------------------------------------------------------------------------- watching Jobs


class JobWatch(threading.Thread):
    """Records, per Job name in one namespace, when it was seen ADDED and DELETED (client clock)."""

    def __init__(self, api: Any, ns: str) -> None:
        super().__init__(name=f"jobwatch-{ns}", daemon=True)
        from kubernetes import client

        self.batch = client.BatchV1Api(api)
        self.ns = ns
        self.added: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.suspended: dict[str, float] = {}  # first seen with spec.suspend true
        self.owner: dict[str, str] = {}  # job name -> backfill label
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.ready = threading.Event()

    def _note(self, kind: str, obj: dict, now: float) -> None:
        m = obj.get("metadata") or {}
        name = m.get("name", "")
        with self.lock:
            if kind in ("ADDED", "MODIFIED") and name not in self.added:
                self.added[name] = now
                self.owner[name] = (m.get("labels") or {}).get(BACKFILL_LABEL, "")
            elif kind == "DELETED":
                self.deleted.setdefault(name, now)
            if kind == "MODIFIED" and (obj.get("spec") or {}).get("suspend") is True:
                self.suspended.setdefault(name, now)

    def run(self) -> None:
        from kubernetes import watch

        rv = ""
        while not self.stop_event.is_set():
            try:
                if not rv:
                    resp = self.batch.list_namespaced_job(self.ns, label_selector=BACKFILL_LABEL, _preload_content=False)
                    body = json.loads(resp.data)
                    now = time.time()
                    for obj in body.get("items") or []:
                        self._note("ADDED", obj, now)
                    rv = body["metadata"]["resourceVersion"]
                    self.ready.set()
                w = watch.Watch()
                for e in w.stream(
                    self.batch.list_namespaced_job,
                    self.ns,
                    label_selector=BACKFILL_LABEL,
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=30,
                    deserialize=False,
                ):
                    now = time.time()
                    obj = e["object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if e["type"] != "BOOKMARK":
                        self._note(e["type"], obj, now)
                    if self.stop_event.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - 410 or a dropped connection: relist
                if getattr(exc, "status", None) == 410:
                    rv = ""
                time.sleep(0.1)

    def live_jobs(self) -> dict[str, str]:
        """backfill name -> job name, for Jobs seen and not deleted."""
        with self.lock:
            return {self.owner[n]: n for n in self.added if n not in self.deleted}


# --------------------------------------------------------------------------- where the time goes


TIMED = [
    ("Controller", "observe", "watcher: observe (spool + wake the preemptor)"),
    ("Preemptor", "run_once", "preempt: pass (fold in memory + decide + cancel)"),
    ("Actor", "preempt", "  actor.preempt (parallel DELETEs; Events queued)"),
    ("Actor", "delete_job", "    of which Job DELETE"),
    ("Controller", "catch_up", "loop: catch_up (read + fold + RunStore.apply)"),
    ("RunStore", "apply", "  of which RunStore.apply"),
    ("Controller", "step", "loop: step (decide + execute, no cancels)"),
    ("Actor", "write_status", "status-writer: write_status (PUT, GET only on conflict)"),
    ("EventStore", "append", "EventStore.append (log-writer and admissions)"),
]
"""(class, method, label) of the methods timed during the paced samples."""
GC_LABELS = ("garbage collector: young pass (generation 0-1), all threads stopped", "garbage collector: full pass (generation 2), all threads stopped")
"""Labels of the cyclic collector's passes in the same table (``gc.callbacks``)."""


class Timers:
    """Wall time spent in a few controller methods (wrapped on their classes at run time; the
    controller's code is not changed). ``reset()`` at the start of a phase, ``snapshot()`` at its end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, cls: Any, attr: str, label: str) -> None:
        original = getattr(cls, attr)
        timers = self

        def timed(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                dt_ = time.perf_counter() - t
                with timers.lock:
                    timers.calls.setdefault(label, []).append(dt_)

        setattr(cls, attr, timed)
        self._undo.append((cls, attr, original))

    def install(self) -> None:
        from backfill.controller.actor import Actor
        from backfill.controller.loop import Controller
        from backfill.controller.preempt import Preemptor
        from backfill.store import EventStore, RunStore

        for cls, attr, label in TIMED:
            self.wrap({"Actor": Actor, "Controller": Controller, "Preemptor": Preemptor, "EventStore": EventStore, "RunStore": RunStore}[cls], attr, label)
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        label = GC_LABELS[1] if info["generation"] == 2 else GC_LABELS[0]
        with self.lock:
            self.calls.setdefault(label, []).append(time.perf_counter() - self._gc_start)

    def uninstall(self) -> None:
        for cls, attr, original in reversed(self._undo):
            setattr(cls, attr, original)
        self._undo.clear()
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def reset(self) -> None:
        with self.lock:
            self.calls = {}

    def snapshot(self) -> dict[str, list[float]]:
        with self.lock:
            return {k: list(v) for k, v in self.calls.items()}


# --------------------------------------------------------------------------- set-up


def start_cluster(audit_dir: Path, audit_policy: str = AUDIT_POLICY) -> Any:
    """A started LocalCluster (no CRDs yet) auditing by ``audit_policy`` to ``audit_dir/audit.log``."""
    from tests.envtest.cluster import LocalCluster, ensure_binaries

    policy = audit_dir / "audit-policy.yaml"
    policy.write_text(audit_policy)
    cluster = LocalCluster(
        ensure_binaries(),
        extra_apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_dir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
        ],
    )
    cluster.start()
    return cluster


def api_client(cluster: Any, pool: int) -> Any:
    from kubernetes import client

    cfg = cluster.configuration()
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def pmap(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    return list(pool.map(fn, items))


def cronjob_body(name: str, indexed: bool = False) -> dict[str, Any]:
    """A suspended CronJob ``name`` whose jobTemplate runs busybox ``true`` (a template for
    ModelBackfills); ``indexed``: an Indexed Job of 4 shards, one at a time."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": "0 0 1 1 *",
            "suspend": True,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "main", "image": "busybox", "command": ["true"], "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
                            ],
                        }
                    },
                }
            },
        },
    }
    if indexed:
        body["spec"]["jobTemplate"]["spec"].update(completionMode="Indexed", completions=4, parallelism=1)
    return body


def create_model(co: Any, ns: str, i: int, last_active: str) -> None:
    """Model ``model_name(i)`` on node ``node-<i>``, then its status: Ready, ``lastActiveTime`` as given (RFC 3339)."""
    name = model_name(i)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": f"node-{i:05d}"}},
    }
    co.create_namespaced_custom_object(GROUP, VERSION, ns, "models", body, _preload_content=False)
    co.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "models", name, {"status": {"phase": "Ready", "lastActiveTime": last_active}},
        _content_type="application/merge-patch+json", _preload_content=False,
    )


def create_objects(api: Any, n: int, workers: int, resumable: frozenset[int] = frozenset()) -> dict[str, float]:
    """Namespaces, the CronJobs, 2 x n Models (Ready, long idle), n ModelBackfills (ours; those
    in ``resumable`` with ``preemption: Suspend`` on the Indexed template), n Jobs (baseline).
    Returns timings."""
    from kubernetes import client

    core, batch, co = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
    for ns in (NS_OURS, NS_BASE):
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    batch.create_namespaced_cron_job(NS_OURS, cronjob_body(TEMPLATE), _preload_content=False)
    batch.create_namespaced_cron_job(NS_OURS, cronjob_body(TEMPLATE_INDEXED, indexed=True), _preload_content=False)
    long_ago = ts(datetime.now(timezone.utc) - timedelta(hours=2))

    def model(arg: tuple[str, int]) -> None:
        create_model(co, arg[0], arg[1], long_ago)

    def backfill(i: int) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ModelBackfill",
            "metadata": {"name": backfill_name(i)},
            "spec": {"modelRef": model_name(i), "templateRef": TEMPLATE, "idleFor": "2s", "maxRunDuration": "15m"},
        }
        if i in resumable:
            body["spec"].update(templateRef=TEMPLATE_INDEXED, preemption="Suspend")
        co.create_namespaced_custom_object(GROUP, VERSION, NS_OURS, "modelbackfills", body, _preload_content=False)

    out: dict[str, float] = {}
    with ThreadPoolExecutor(workers) as pool:
        t = time.monotonic()
        pmap(pool, model, [(ns, i) for i in range(n) for ns in (NS_OURS, NS_BASE)])
        out["models"] = time.monotonic() - t
        t = time.monotonic()
        pmap(pool, backfill, range(n))
        out["backfills"] = time.monotonic() - t
        t = time.monotonic()
        pmap(pool, lambda i: create_baseline_job(batch, i), range(n))
        out["baseline_jobs"] = time.monotonic() - t
    return out


def create_baseline_job(batch: Any, i: int) -> None:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{backfill_name(i)}-base-1", "labels": {BACKFILL_LABEL: backfill_name(i)}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}
            },
        },
    }
    batch.create_namespaced_job(NS_BASE, body, _preload_content=False)


def wait_until(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> float:
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t


# --------------------------------------------------------------------------- the baseline


class Floor(threading.Thread):
    """The floor: one Model watch, and on a lastActiveTime change one Job DELETE of the Job it
    already knows (no store, no projection, no status). The least any controller can do.

    ``jobs``: backfill name -> Job name of the samples it serves (only those: two floors in one
    namespace never delete each other's Jobs). ``workers`` > 1: the DELETEs go out on that many
    threads instead of one after the other from the watch thread (the parallel floor for a
    burst, as many as the controller's job-deletes pool)."""

    def __init__(self, api: Any, ns: str, jobs: dict[str, str], workers: int = 1) -> None:
        super().__init__(name="floor", daemon=True)
        from kubernetes import client

        self.co, self.batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        self.ns, self.jobs = ns, dict(jobs)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="floor-deletes") if workers > 1 else None
        self.stop_event = threading.Event()
        self.ready = threading.Event()

    def _delete_job(self, job: str) -> None:
        self.batch.delete_namespaced_job(job, self.ns, propagation_policy="Background", _preload_content=False)

    def run(self) -> None:
        from kubernetes import watch

        body = json.loads(self.co.list_namespaced_custom_object(GROUP, VERSION, self.ns, "models", _preload_content=False).data)
        seen = {m["metadata"]["name"]: (m.get("status") or {}).get("lastActiveTime", "") for m in body["items"]}
        rv = body["metadata"]["resourceVersion"]
        self.ready.set()
        while not self.stop_event.is_set():
            w = watch.Watch()
            for e in w.stream(
                self.co.list_namespaced_custom_object, GROUP, VERSION, self.ns, "models",
                resource_version=rv, timeout_seconds=5, deserialize=False,
            ):
                obj = e.get("raw_object") or e["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                name = obj["metadata"]["name"]
                at = (obj.get("status") or {}).get("lastActiveTime", "")
                if at != seen.get(name):
                    seen[name] = at
                    job = self.jobs.pop("bf-" + name[2:], None)
                    if job and self.pool is not None:
                        self.pool.submit(self._delete_job, job)
                    elif job:
                        self._delete_job(job)
                if self.stop_event.is_set():
                    break
        if self.pool is not None:
            self.pool.shutdown(wait=False)


class Poller(threading.Thread):
    """Upstream's behaviour: every 5 s list Models and Jobs; delete the Job of every Model whose
    lastActiveTime moved since the previous poll."""

    def __init__(self, api: Any, ns: str, interval: float = BASELINE_INTERVAL) -> None:
        super().__init__(name="baseline-poller", daemon=True)
        from kubernetes import client

        self.co, self.batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        self.ns, self.interval = ns, interval
        self.stop_event = threading.Event()
        self.polls = 0
        self.poll_seconds: list[float] = []

    def run(self) -> None:
        seen: dict[str, str] | None = None
        next_at = time.monotonic() + random.uniform(0, self.interval)
        while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            t = time.monotonic()
            try:
                models = json.loads(
                    self.co.list_namespaced_custom_object(GROUP, VERSION, self.ns, "models", _preload_content=False).data
                )["items"]
                jobs = json.loads(
                    self.batch.list_namespaced_job(self.ns, label_selector=BACKFILL_LABEL, _preload_content=False).data
                )["items"]
            except Exception as exc:  # noqa: BLE001
                say(f"[red]baseline poll failed: {exc}[/red]")
                continue
            active = {m["metadata"]["name"]: (m.get("status") or {}).get("lastActiveTime", "") for m in models}
            job_of = {j["metadata"]["labels"][BACKFILL_LABEL]: j["metadata"]["name"] for j in jobs if not j["metadata"].get("deletionTimestamp")}
            if seen is not None:
                for name, at in active.items():
                    if at != seen.get(name):
                        job = job_of.get("bf-" + name[2:])
                        if job:
                            try:
                                self.batch.delete_namespaced_job(job, self.ns, propagation_policy="Background", _preload_content=False)
                            except Exception as exc:  # noqa: BLE001
                                if getattr(exc, "status", None) != 404:
                                    say(f"[red]baseline delete {job} failed: {exc}[/red]")
            seen = active
            self.polls += 1
            self.poll_seconds.append(time.monotonic() - t)


# --------------------------------------------------------------------------- sampling


class Sample:
    def __init__(self, ns: str, index: int, job: str, suspend: bool = False) -> None:
        self.ns, self.index, self.job = ns, index, job
        self.suspend = suspend  # measured to the Job's suspend PATCH, not its DELETE
        self.audit_id: str | None = None
        self.t0_client: float | None = None  # PATCH call returned (client clock, epoch s)
        self.t0_server: float | None = None  # audit ResponseComplete of the PATCH
        self.t1_server: float | None = None  # audit ResponseComplete of the Job DELETE
        self.t1_client: float | None = None  # Job watch saw DELETED


def patch_active(co: Any, s: Sample) -> None:
    now = ts(datetime.now(timezone.utc))
    resp = co.patch_namespaced_custom_object_status_with_http_info(
        GROUP, VERSION, s.ns, "models", model_name(s.index), {"status": {"lastActiveTime": now}},
        _content_type="application/merge-patch+json",
    )
    s.t0_client = time.time()
    headers = resp[2] if isinstance(resp, tuple) else resp.headers  # (data, status, headers) or ApiResponse
    s.audit_id = header(headers, "Audit-Id")


def run_samples(
    api: Any, ns: str, picks: list[int], jobs: dict[str, str], group: int, gap: tuple[float, float],
    suspending: frozenset[int] = frozenset(),
) -> list[Sample]:
    """Patch the sampled Models ``group`` at a time (concurrently), a random gap between groups
    (those in ``suspending`` are measured to their Job's suspend)."""
    from kubernetes import client

    co = client.CustomObjectsApi(api)
    samples = [Sample(ns, i, jobs[backfill_name(i)], i in suspending) for i in picks]
    with ThreadPoolExecutor(max(group, 1)) as pool:
        for k in range(0, len(samples), group):
            batch = samples[k : k + group]
            pmap(pool, lambda s: patch_active(co, s), batch)
            if k + group < len(samples):
                time.sleep(random.uniform(*gap))
    return samples


def wait_deleted(watcher: JobWatch, samples: list[Sample], timeout: float) -> None:
    """Wait until the watch saw every sampled Job deleted (a suspending sample's: suspended)."""

    def seen(s: Sample) -> float | None:
        return (watcher.suspended if s.suspend else watcher.deleted).get(s.job)

    def done() -> bool:
        with watcher.lock:
            return all(seen(s) is not None for s in samples)

    try:
        wait_until(done, timeout, "the sampled Jobs to be deleted (or suspended)", interval=0.1)
    except SystemExit as exc:
        say(f"[red]{exc}[/red] (missing ones are left out of the statistics)")
    with watcher.lock:
        for s in samples:
            s.t1_client = seen(s)


def retire_suspended(api: Any, samples: list[Sample], workers: int) -> None:
    """After the measure: set ``spec.suspend: true`` on the suspending samples' ModelBackfills,
    so the controller deletes their Jobs and stays quiet for the later phases (nobody plays the
    Job controller's ``Suspended`` condition, so their attempts would otherwise keep re-issuing
    the suspend, paced up to every 30 s)."""
    from kubernetes import client

    co = client.CustomObjectsApi(api)
    with ThreadPoolExecutor(workers) as pool:
        pmap(
            pool,
            lambda s: co.patch_namespaced_custom_object(
                GROUP, VERSION, s.ns, "modelbackfills", backfill_name(s.index), {"spec": {"suspend": True}},
                _content_type="application/merge-patch+json", _preload_content=False,
            ),
            [s for s in samples if s.suspend],
        )


def audit_entries(path: Path) -> Iterator[dict[str, Any]]:
    """The ``ResponseComplete`` entries of an apiserver JSON audit log (unparsable lines skipped)."""
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("stage") == "ResponseComplete":
                yield e


def read_audit(path: Path, samples: list[Sample]) -> None:
    patches: dict[str, float] = {}
    deletes: dict[tuple[str, str], list[float]] = {}
    suspends: dict[tuple[str, str], list[float]] = {}  # PATCHes of the Job itself (not its status)
    for e in audit_entries(path):
        ref = e.get("objectRef") or {}
        code = (e.get("responseStatus") or {}).get("code", 0)
        at = parse_ts(e["stageTimestamp"])
        if ref.get("resource") == "models" and ref.get("subresource") == "status":
            patches[e["auditID"]] = at
        elif ref.get("resource") == "jobs" and e.get("verb") == "delete" and 200 <= code < 300:
            deletes.setdefault((ref.get("namespace", ""), ref.get("name", "")), []).append(at)
        elif ref.get("resource") == "jobs" and e.get("verb") == "patch" and not ref.get("subresource") and 200 <= code < 300:
            suspends.setdefault((ref.get("namespace", ""), ref.get("name", "")), []).append(at)
    for s in samples:
        s.t0_server = patches.get(s.audit_id or "")
        if s.t0_server is not None:
            after = [t for t in (suspends if s.suspend else deletes).get((s.ns, s.job), []) if t >= s.t0_server]
            s.t1_server = min(after) if after else None


def embedded_server(settings: Any) -> Any:
    """The embedded PostgreSQL server object of ``settings.data_dir`` (None with an external
    database)."""
    if settings.database_url:
        return None
    from backfill.store import engine as engine_module

    return engine_module._embedded.get((Path(settings.data_dir) / "pg").expanduser().resolve())


def private_data_dir() -> Path:
    """The embedded server's data directory for this benchmark: ``bench-latency`` inside the
    configured one (``BACKFILL_DATA_DIR``, default ``.backfill``). The run stops that server
    (``pg_ctl stop``) to measure cancels with the store down; a controller, a ``db shell`` or
    another bench sharing the default server must not lose it."""
    from backfill.settings import Settings

    return Path(Settings().data_dir) / "bench-latency"


def audit(events: Any) -> str:
    """Replay the whole log with the auditor; a short verdict."""
    from backfill.core.audit import Auditor
    from backfill.core.events import decode_many

    auditor = Auditor()
    log_: dict[int, Any] = {}
    for batch in events.read_payloads(0):
        for (position, *_), e in zip(batch, decode_many([(t, v, d) for _, t, v, d in batch])):
            auditor.feed(position, e)
            log_[position] = e
    for d in auditor.divergences[:3]:
        say(f"[red]divergence at {d.position}: recorded {d.recorded}; derived {d.derived}[/red]")
        e = log_[d.position]
        near = [p for p in sorted(log_) if getattr(log_[p], "backfill", None) == e.backfill or getattr(log_[p], "model", None) == getattr(e, "model", "?")]
        for p in near[-12:]:
            say(f"   {p}: {log_[p].type} {getattr(log_[p], 'at', '')} {getattr(log_[p], 'cause', '')}/{getattr(log_[p], 'basis', '')}")
    return f"{auditor.checked} decisions checked, {len(auditor.divergences)} divergent, {len(auditor.unverifiable)} unverifiable"


def stats(samples: list[Sample]) -> dict[str, Any]:
    server = [(s.t1_server - s.t0_server) * 1000 for s in samples if s.t0_server and s.t1_server]
    client_ = [(s.t1_client - s.t0_client) * 1000 for s in samples if s.t0_client and s.t1_client]
    return {
        "n": len(samples),
        "ok": len(server),
        "p50": pctl(server, 50),
        "p99": pctl(server, 99),
        "max": max(server) if server else float("nan"),
        "c50": pctl(client_, 50),
        "c99": pctl(client_, 99),
    }


# --------------------------------------------------------------------------- main


def figures(
    args: argparse.Namespace,
    so: dict[str, Any],
    sf: dict[str, Any],
    sburst: dict[str, Any] | None,
    sfb: dict[str, Any] | None,
    sdown: dict[str, Any] | None,
    sdown_b: dict[str, Any] | None,
    sb: dict[str, Any],
    audit_note: str,
    ssus: dict[str, Any] | None = None,
    sfbp: dict[str, Any] | None = None,
) -> list[Row]:
    """The rows of one run (a missing phase gives a row without a value, saying why). The burst
    rows' baseline is the parallel floor (``sfbp``) when it was measured, else the serial one."""
    nan = float("nan")
    where = f"{args.models:,} Models and ModelBackfills"
    rows: list[Row] = []
    for q, target in (("p50", TARGET_P50_MS), ("p99", TARGET_P99_MS)):
        rows.append(
            Row(
                f"suspend latency {q}, PostgreSQL up",
                ssus[q] if ssus else None,
                "ms",
                baseline=so[q],
                baseline_name="DELETE, same run",
                target=target,
                higher_is_better=False,
                note=(f"Model status PATCH -> Job spec.suspend PATCH (audit log), {ssus['ok']}/{ssus['n']} paced samples "
                      f"of preemption: Suspend declarations shuffled among the DELETE ones (issue 11)")
                if ssus else "not measured (--suspend 0)",
            )
        )
    for label, st_, fl_, fb_, bst in (("PostgreSQL up", so, sf, sfb, sburst), ("PostgreSQL stopped", sdown, sf, sfb, sdown_b)):
        why = "" if st_ is not None else "not measured: an external database is not stopped"
        for q, target in (("p50", TARGET_P50_MS), ("p99", TARGET_P99_MS)):
            rows.append(
                Row(
                    f"cancel latency {q}, {label}",
                    st_[q] if st_ else None,
                    "ms",
                    baseline=fl_[q],
                    baseline_name="floor",
                    target=target,
                    higher_is_better=False,
                    note=why or f"Model status PATCH -> Job DELETE (audit log), {st_['ok']}/{st_['n']} paced samples, {where}; "
                    f"floor: a bare watch -> DELETE on the same apiserver ({fl_['ok']} samples)"
                    + (f"; replay audit after PostgreSQL returned: {audit_note}" if st_ is sdown and st_ else ""),
                )
            )
        rows.append(
            Row(
                f"cancel latency burst p99, {label}",
                bst["p99"] if bst else None,
                "ms",
                baseline=(sfbp or fb_ or {"p99": nan})["p99"],
                baseline_name=f"floor burst, {DELETE_WORKERS} parallel DELETEs" if sfbp else "floor burst",
                target=TARGET_BURST_P99_MS,
                higher_is_better=False,
                note=why or (
                    f"{bst['ok']}/{bst['n']} Models patched at once"
                    + (f"; the serial floor (one DELETE at a time): {fb_['p99']:.1f} ms" if sfbp and fb_ else "")
                    if bst else "no burst (--burst 0)"
                ),
            )
        )
    for q in ("p50", "p99"):
        rows.append(
            Row(
                f"speed-up over the upstream 5 s poller, {q}",
                sb[q] / so[q] if so[q] else nan,
                "x",
                target=TARGET_RATIO,
                note=f"poller {q} {sb[q]:.0f} ms ({sb['ok']} samples) / ours {q} {so[q]:.1f} ms",
            )
        )
    return rows



def build_parser() -> argparse.ArgumentParser:
    """The command line of this benchmark (also used by ``python -m bench`` to build its arguments)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000, help="Models and ModelBackfills (default 1000)")
    parser.add_argument("--samples", type=int, default=200, help="paced samples per side (default 200)")
    parser.add_argument("--burst", type=int, default=50, help="extra samples for ours, all at once (default 50; 0: none)")
    parser.add_argument("--group", type=int, default=4, help="paced samples patched together (default 4)")
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between paced groups, uniform +-50%% (default 1.0)")
    parser.add_argument("--resync", type=float, default=None, help="controller resync_seconds (default: the Settings default)")
    parser.add_argument("--workers", type=int, default=16, help="threads creating the objects (default 16)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds let pass between phases (default 3; a third of it between a phase's parts)")
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (default: embedded server)")
    parser.add_argument(
        "--suspend", type=int, default=None,
        help="paced samples of preemption: Suspend declarations, shuffled among the DELETE ones (default: --samples; 0: none)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if 2 * (args.samples + args.burst) + n_suspend(args) > args.models:
        parser.error("2 x (--samples + --burst) + --suspend must not exceed --models (database up, then stopped)")
    run(args)
    return 0


def n_suspend(args: argparse.Namespace) -> int:
    """How many suspending samples (``--suspend``; default ``--samples``, limited by ``--models``)."""
    want = args.samples if getattr(args, "suspend", None) is None else args.suspend
    return max(0, min(want, args.models - 2 * (args.samples + args.burst)))


def run(args: argparse.Namespace, cluster: Any = None, audit_log: Path | None = None) -> list[Row]:
    """Run the benchmark with ``args`` (as :func:`build_parser` makes them), print its tables and
    return its figures: ours vs the floor at p50, p99 and burst p99 with PostgreSQL up and
    stopped (issue 8 targets), and the speed-up over the upstream poller (issue 4 target).

    A given ``cluster`` (CRDs applied, auditing at least :data:`AUDIT_POLICY` to ``audit_log``)
    is used and left running; otherwise one is started and stopped here."""

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from backfill.controller.loop import Controller
    from backfill.controller.metrics import Metrics
    from backfill.settings import Settings
    from backfill.store import EventStore, RunStore, make_engine, resolve_database_url, upgrade

    t_all = time.monotonic()
    settings_kw: dict[str, Any] = {"database_url": args.database_url} if args.database_url else {"data_dir": private_data_dir()}
    url, note = resolve_database_url(Settings(**settings_kw))
    schema = f"bench_{secrets.token_hex(4)}"
    upgrade(url, schema)
    say(f"PostgreSQL schema {schema} ready{' (' + note.split(' (')[0] + ')' if note else ''}")

    own = cluster is None
    audit_dir = Path(tempfile.mkdtemp(prefix="backfill-bench-audit-")) if own else None
    if own:
        cluster = start_cluster(audit_dir)
        audit_log = audit_dir / "audit.log"
    api = api_client(cluster, pool=max(args.workers, args.burst, 8) + 4)
    controller = events = engine = None
    watches: list[JobWatch] = []
    poller: Poller | None = None
    try:
        if own:
            cluster.apply_crds(
                sorted((ROOT / "deploy" / "crds").glob("*.ai.flexinfer.yaml")) + sorted((ROOT / "tests" / "envtest" / "crds").glob("*.yaml"))
            )
        say(f"kube-apiserver ready in {cluster.startup_seconds:.1f} s; CRDs applied; audit log {audit_log}")

        picks = random.sample(range(args.models), min(args.models, 2 * (args.samples + args.burst) + n_suspend(args)))
        resumable = frozenset(picks[2 * (args.samples + args.burst) :])
        t = time.monotonic()
        created = create_objects(api, args.models, args.workers, resumable)
        create_s = time.monotonic() - t
        n_objects = 2 * args.models + args.models + args.models
        say(f"created {n_objects} objects in {create_s:.1f} s")

        watches = [JobWatch(api, ns) for ns in (NS_OURS, NS_BASE)]
        for w in watches:
            w.start()
            w.ready.wait(30)
        w_ours, w_base = watches

        # -- our controller: admit everything, then play the Job controller (Running)
        resync_kw = {"resync_seconds": args.resync} if args.resync else {}
        settings = Settings(namespace=NS_OURS, **settings_kw, **resync_kw)
        timers = Timers()
        timers.install()
        engine = make_engine(url, schema)
        events = EventStore(engine, poll=settings.poll_fallback_seconds)
        capi = api_client(cluster, pool=40)
        controller = Controller(settings, capi, events, RunStore(engine), Metrics(), leader=None, identity="bench")
        t = time.monotonic()
        controller.start()
        synced_s = wait_until(lambda: controller.synced, 60, "the watchers to sync")
        frozen = freeze_heap()  # what ``backfill controller`` does once its watchers synced
        admit_s = wait_until(lambda: len(w_ours.live_jobs()) >= args.models, 300, f"{args.models} Jobs to exist", 0.2)
        admit_s += synced_s
        say(f"controller synced in {synced_s:.1f} s; all {args.models} Jobs existed {admit_s:.1f} s after start")

        from kubernetes import client

        batch = client.BatchV1Api(api)
        start_time = ts(datetime.now(timezone.utc))
        jobs_ours = w_ours.live_jobs()
        t = time.monotonic()
        with ThreadPoolExecutor(args.workers) as pool:
            pmap(
                pool,
                lambda j: batch.patch_namespaced_job_status(
                    j, NS_OURS, {"status": {"startTime": start_time, "active": 1}}, _preload_content=False
                ),
                jobs_ours.values(),
            )
        running = lambda: sum(1 for a in controller.world.live.values() if a.lifecycle == "Running")  # noqa: E731
        run_s = wait_until(lambda: running() >= args.models, 120, "every attempt Running", 0.2)
        # quiet: the log stops growing (status writes done)
        last, still = controller.position, time.monotonic()
        while time.monotonic() - still < min(2.0, 2 * args.pause):
            time.sleep(0.2)
            if controller.position != last:
                last, still = controller.position, time.monotonic()
        settle_s = time.monotonic() - t
        say(f"all attempts Running and the controller quiet {settle_s:.1f} s later (Running after {run_s:.1f} s)")

        # -- ours: paced samples, then a burst; then the same with PostgreSQL stopped
        n_base = args.samples + args.burst  # floor: paced + burst; baseline: paced (disjoint)
        paced, burst = picks[: args.samples], picks[args.samples : args.samples + args.burst]
        down_paced = picks[args.samples + args.burst : 2 * args.samples + args.burst]
        down_burst = picks[2 * args.samples + args.burst : 2 * (args.samples + args.burst)]
        t = time.monotonic()
        timers.reset()
        mixed = paced + sorted(resumable)
        random.shuffle(mixed)  # DELETE and suspend samples side by side, in one paced sequence
        both = run_samples(api, NS_OURS, mixed, jobs_ours, args.group, (0.5 * args.gap, 1.5 * args.gap), resumable)
        wait_deleted(w_ours, both, 30)
        ours = [s for s in both if not s.suspend]
        ours_suspend = [s for s in both if s.suspend]
        say(f"ours: {len(ours)} paced DELETE + {len(ours_suspend)} suspend samples in {time.monotonic() - t:.1f} s")
        spent = timers.snapshot()
        if ours_suspend:
            retire_suspended(api, ours_suspend, args.workers)
        ours_burst: list[Sample] = []
        if burst:
            time.sleep(args.pause)  # let the re-admissions of the paced samples pass
            ours_burst = run_samples(api, NS_OURS, burst, jobs_ours, len(burst), (0, 0))
            wait_deleted(w_ours, ours_burst, 30)
            say(f"ours: burst of {len(burst)} done")
        down: list[Sample] = []
        down_b: list[Sample] = []
        audit_note = "n/a (external database: not stopped)"
        server = embedded_server(settings)
        if server is not None and down_paced:
            time.sleep(args.pause)
            server._stop()  # pg_ctl stop: the store refuses every connection from now on
            say("PostgreSQL stopped")
            try:
                down = run_samples(api, NS_OURS, down_paced, jobs_ours, args.group, (0.5 * args.gap, 1.5 * args.gap))
                wait_deleted(w_ours, down, 30)
                if down_burst:
                    time.sleep(args.pause / 3)
                    down_b = run_samples(api, NS_OURS, down_burst, jobs_ours, len(down_burst), (0, 0))
                    wait_deleted(w_ours, down_b, 30)
                say(f"ours with PostgreSQL stopped: {len(down)} paced + {len(down_b)} burst samples; "
                    f"{controller.spool.backlog} events spooled; readyz problems: {controller.readiness()[1][:1]}")
            finally:
                server.ensure_postgres_running()
            say("PostgreSQL started again")
            wait_until(lambda: controller.spool.backlog == 0 and controller.store_error is None, 60, "the spool to drain")
            wait_until(lambda: controller.spool.settled(controller.position), 60, "the loop to fold the spooled events")
            audit_note = audit(events)
        controller.stop()
        controller_stats = {"position": controller.position, "appended": controller.actor.appended}

        # -- floor: watch + DELETE, in its own namespace
        jobs_base = w_base.live_jobs()
        base_picks = random.sample(range(args.models), n_base + args.burst + args.samples)
        floor_paced, floor_burst = base_picks[: args.samples], base_picks[args.samples : n_base]
        par_burst = base_picks[n_base : n_base + args.burst]
        of = lambda picks: {backfill_name(i): jobs_base[backfill_name(i)] for i in picks}  # noqa: E731
        floor = Floor(api, NS_BASE, of(floor_paced + floor_burst))
        floor.start()
        floor.ready.wait(30)
        time.sleep(args.pause / 3)
        fl = run_samples(api, NS_BASE, floor_paced, jobs_base, args.group, (0.5 * args.gap, 1.5 * args.gap))
        wait_deleted(w_base, fl, 30)
        fl_b: list[Sample] = []
        fl_bp: list[Sample] = []
        if floor_burst:
            time.sleep(args.pause / 3)
            fl_b = run_samples(api, NS_BASE, floor_burst, jobs_base, len(floor_burst), (0, 0))
            wait_deleted(w_base, fl_b, 30)
        floor.stop_event.set()
        if par_burst:
            # The same burst against a floor that sends its DELETEs in parallel, as many at a
            # time as the controller's job-deletes pool: the least any controller can do with a
            # burst on this apiserver and machine.
            pfloor = Floor(api, NS_BASE, of(par_burst), workers=DELETE_WORKERS)
            pfloor.start()
            pfloor.ready.wait(30)
            time.sleep(args.pause / 3)
            fl_bp = run_samples(api, NS_BASE, par_burst, jobs_base, len(par_burst), (0, 0))
            wait_deleted(w_base, fl_bp, 30)
            pfloor.stop_event.set()
        say(f"floor: {len(fl)} paced + {len(fl_b)} burst samples; parallel floor: {len(fl_bp)} burst samples")

        # -- baseline: the 5 s poller in the same namespace, other Models
        poller = Poller(api, NS_BASE)
        poller.start()
        wait_until(lambda: poller.polls >= 1, 3 * BASELINE_INTERVAL, "the first baseline poll")
        time.sleep(random.uniform(0.0, BASELINE_INTERVAL))  # start at a random phase of the poll
        t = time.monotonic()
        base = run_samples(api, NS_BASE, base_picks[n_base + args.burst :], jobs_base, args.group, (0.5 * args.gap, 1.5 * args.gap))
        wait_deleted(w_base, base, 2 * BASELINE_INTERVAL + 5)
        say(f"baseline: {len(base)} samples in {time.monotonic() - t:.1f} s ({poller.polls} polls)")
        poller.stop_event.set()
        poller.join(10)

        read_audit(audit_log, ours + ours_suspend + ours_burst + down + down_b + fl + fl_b + fl_bp + base)
        so, sb, sf = stats(ours), stats(base), stats(fl)
        ssus = stats(ours_suspend) if ours_suspend else None
        sburst = stats(ours_burst) if ours_burst else None
        sfb = stats(fl_b) if fl_b else None
        sfbp = stats(fl_bp) if fl_bp else None
        sdown = stats(down) if down else None
        sdown_b = stats(down_b) if down_b else None

        # -- the tables
        lat = Table(title=f"Foreground demand -> Job DELETE accepted ({args.models} Models / ModelBackfills)")
        for col in ("", "samples", "p50 ms", "p99 ms", "max ms", "client p50 ms", "client p99 ms"):
            lat.add_column(col, justify="left" if not col else "right")

        def row(label: str, s: dict[str, Any]) -> None:
            lat.add_row(
                label, f"{s['ok']}/{s['n']}", f"{s['p50']:.1f}", f"{s['p99']:.1f}", f"{s['max']:.1f}",
                f"{s['c50']:.1f}", f"{s['c99']:.1f}",
            )

        row(f"floor (watch -> DELETE), {args.group} every ~{args.gap:g} s", sf)
        if sfb:
            row(f"floor, burst of {len(fl_b)} at once", sfb)
        if sfbp:
            row(f"floor with {DELETE_WORKERS} parallel DELETEs, burst of {len(fl_bp)}", sfbp)
        row(f"ours, {args.group} every ~{args.gap:g} s", so)
        if ssus:
            row(f"ours, spec.suspend instead of DELETE (shuffled among them)", ssus)
        if sburst:
            row(f"ours, burst of {len(ours_burst)} at once", sburst)
        if sdown:
            row(f"ours, PostgreSQL stopped, {args.group} every ~{args.gap:g} s", sdown)
        if sdown_b:
            row(f"ours, PostgreSQL stopped, burst of {len(down_b)}", sdown_b)
        row(f"baseline (poll every {BASELINE_INTERVAL:.0f} s)", sb)
        console.print(lat)
        console.print(
            "[dim]p50/p99/max: server side, audit log stageTimestamp (ResponseComplete) of the Model status "
            "PATCH -> of the Job DELETE. client: PATCH call returned -> bench's Job watch saw DELETED.[/dim]"
        )

        cmp_ = Table(title="Ratios and targets")
        for col in ("", "value", "target", "met"):
            cmp_.add_column(col, justify="left" if col in ("", "met") else "right")

        def target(label: str, value: float, limit: float) -> None:
            cmp_.add_row(label, f"{value:.1f} ms", f"<= {limit:.0f} ms", "yes" if value <= limit else "NO")

        for label, st_, fl_ in (("", so, sf), (", PostgreSQL stopped", sdown, sf)):
            if st_ is None:
                continue
            target(f"ours p50{label}", st_["p50"], TARGET_P50_MS)
            target(f"ours p99{label}", st_["p99"], TARGET_P99_MS)
            cmp_.add_row(f"ours / floor at p50{label}", f"{st_['p50'] / fl_['p50']:.1f}x", "-", "-")
            cmp_.add_row(f"ours / floor at p99{label}", f"{st_['p99'] / fl_['p99']:.1f}x", "-", "-")
        for label, st_ in (("", sburst), (", PostgreSQL stopped", sdown_b)):
            if st_ is None:
                continue
            target(f"ours p99, burst{label}", st_["p99"], TARGET_BURST_P99_MS)
            for name, fl_ in (("floor", sfb), ("parallel floor", sfbp)):
                if fl_:
                    cmp_.add_row(f"ours / {name} at burst p99{label}", f"{st_['p99'] / fl_['p99']:.1f}x", "-", "-")
        r50, r99 = sb["p50"] / so["p50"], sb["p99"] / so["p99"]
        cmp_.add_row("baseline / ours at p50", f"{r50:.0f}x", f">= {TARGET_RATIO:.0f}x", "yes" if r50 >= TARGET_RATIO else "NO")
        cmp_.add_row("baseline / ours at p99", f"{r99:.0f}x", f">= {TARGET_RATIO:.0f}x", "yes" if r99 >= TARGET_RATIO else "NO")
        cmp_.add_row("replay audit after PostgreSQL returned", audit_note, "no divergence", "-")
        console.print(cmp_)

        order = [label for _, _, label in TIMED] + list(GC_LABELS)
        where = Table(title=f"Where our controller's time went during the {len(ours)} paced samples (wall time per call)")
        for col in ("", "calls", "mean ms", "p99 ms", "total s"):
            where.add_column(col, justify="left" if not col else "right")
        for label in order:
            v = [x * 1000 for x in spent.get(label, [])]
            if v:
                where.add_row(label, str(len(v)), f"{statistics.mean(v):.1f}", f"{pctl(v, 99):.1f}", f"{sum(v) / 1000:.2f}")
        console.print(where)

        setup = Table(title="Set-up")
        setup.add_column("")
        setup.add_column("seconds", justify="right")
        setup.add_column("note")
        setup.add_row("create objects", f"{create_s:.1f}", (
            f"{2 * args.models} Models (create + status) {created['models']:.1f} s, {args.models} ModelBackfills "
            f"{created['backfills']:.1f} s, {args.models} baseline Jobs {created['baseline_jobs']:.1f} s; {args.workers} threads"
        ))
        setup.add_row("controller start -> all Jobs exist", f"{admit_s:.1f}", (
            f"{args.models} admissions (watchers synced in {synced_s:.1f} s; then {frozen:,} objects of the start-up heap "
            "frozen, as backfill controller does)"
        ))
        setup.add_row("Jobs marked running -> controller quiet", f"{settle_s:.1f}", "every attempt Running, log idle for 2 s")
        setup.add_row("baseline poll (list Models + Jobs)", f"{statistics.median(poller.poll_seconds) if poller.poll_seconds else float('nan'):.3f}", f"median of {len(poller.poll_seconds)} polls")
        setup.add_row("controller resync_seconds", f"{settings.resync_seconds:g}", "full re-check of every ModelBackfill (statuses re-read after actor.forget())")
        setup.add_row("whole run", f"{time.monotonic() - t_all:.1f}", f"event log position {controller_stats['position']}")
        console.print(setup)
        return figures(args, so, sf, sburst, sfb, sdown, sdown_b, sb, audit_note, ssus, sfbp)
    finally:
        if poller is not None:
            poller.stop_event.set()
        if controller is not None:
            controller.stop()
        for w in watches:
            w.stop_event.set()
        if events is not None:
            events.close()
        if engine is not None:
            engine.dispose()
        api.close()
        teardown(cluster if own else None, url, schema, audit_dir)


def teardown(cluster: Any, url: str, schema: str, audit_dir: Path | None) -> None:
    """Stop ``cluster`` (None: leave it), drop the scratch ``schema``, remove ``audit_dir`` (None: keep)."""
    import shutil

    from backfill.store import drop_schema

    if cluster is not None:
        cluster.stop()
    try:
        drop_schema(url, schema)
    except Exception as exc:  # noqa: BLE001
        say(f"dropping schema {schema} failed: {exc}")
    if audit_dir is not None:
        shutil.rmtree(audit_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
