"""Benchmark: the controller at scale on a real kube-apiserver (issue 10, "Benchmarks").

Usage::

    .venv/bin/python bench/bench_scale.py [--models 1000] [--backfills 10000] [--log-events 5000000]
                                          [--idle 60] [--database-url URL]

What it does, in one run:

1. Starts a kube-apiserver + etcd (``tests/envtest``) with an audit log of Job and CronJob
   creates, and creates ``--models`` Models (Ready, ``status.lastActiveTime`` two hours ago,
   one node each) and ``--backfills`` ModelBackfills on them (``idleFor: 30m``; the finalizer
   already present, as on a cluster the controller has run on), all naming one CronJob
   template that does **not** exist (so every ModelBackfill is Blocked, nothing is admitted).
2. Writes an event log of ``--log-events`` events behind it (``EventStore.append`` in batches of
   50,000), shaped as the watchers record a month of this cluster: the CronJob seen and later
   deleted, one BackfillApplied per ModelBackfill, and ``lastActiveTime`` bumps spread over 30
   days, each a ModelReady re-observation (new resourceVersion) plus its ForegroundRequest, the
   last ones exactly what the watchers translate from the objects as they are now (so the
   relist at start-up adds nothing). The rows are the encoder's own output with the times
   substituted (checked against :func:`backfill.core.events.encode` for a sample).
3. **First start** (the baseline): a child process hosting one
   :class:`backfill.controller.loop.Controller` (no leader election) starts, syncs, makes its
   first reconcile pass, settles (status writes done, the log idle) and stops. Whatever the
   controller persists for its next start (a snapshot, when the store and the controller have
   them) it persists here.
4. **Cold start**: a fresh child process does the same, timed from ``start()`` until every
   watcher is synced and the first full reconcile pass (``Controller.step`` with every key)
   returned. Then, once the log is idle: **idle CPU** over ``--idle`` seconds (user + system
   CPU time of the child, which hosts only the controller, ``psutil``), and **resident memory**:
   the child's RSS after the idle minute minus its RSS just before the Controller was built
   (imports, settings and the API client already loaded) — the growth attributable to the
   controller (the total RSS and the peak ``ru_maxrss`` are in the note).
5. **Admissions**: the template CronJob is created, which makes one admission per Model due at
   the same instant (the other ModelBackfills of a Model wait: one backfill per model). Timed
   from the CronJob create to the last of those Job creates, both ``ResponseComplete`` in the
   apiserver's audit log.

No assertions: :func:`run` returns :class:`bench.rows.Row` figures with their targets
(cold start <= 10 s, idle CPU <= 5% of a core, memory <= 300 MB, 1,000 admissions <= 5 s).
The embedded PostgreSQL server is used unless ``--database-url`` / ``BACKFILL_DATABASE_URL``
is set; the scratch schema is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.rows import Row  # noqa: E402

GROUP, VERSION = "ai.flexinfer", "v1alpha2"
NS = "bench-scale"
TEMPLATE = "scale-template"
COLD_START_TARGET = 10.0
IDLE_CPU_TARGET = 5.0
MEMORY_TARGET = 300.0
ADMISSIONS_TARGET = 5.0
BATCH = 50_000

def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def ts(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def start_cluster(audit_dir: Path) -> Any:
    """A started LocalCluster auditing by ``bench_latency.AUDIT_POLICY`` to ``audit_dir/audit.log``, CRDs applied."""
    from bench.bench_latency import AUDIT_POLICY, start_cluster as start

    cluster = start(audit_dir, AUDIT_POLICY)  # Job and CronJob creates and deletes, Model status writes
    try:
        cluster.apply_crds(
            sorted((ROOT / "deploy" / "crds").glob("*.ai.flexinfer.yaml")) + sorted((ROOT / "tests" / "envtest" / "crds").glob("*.yaml"))
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def api_client(host: str, token: str, ca_file: str, pool: int) -> Any:
    from kubernetes import client

    cfg = client.Configuration(host=host, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"}, ssl_ca_cert=ca_file)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def template_body() -> dict[str, Any]:
    from bench.bench_latency import cronjob_body

    return cronjob_body(TEMPLATE)


# --------------------------------------------------------------------------- the cluster


def create_objects(api: Any, models: int, backfills: int, last_active: datetime, workers: int) -> float:
    """The namespace, ``models`` Ready Models and ``backfills`` ModelBackfills (round-robin on
    the Models, finalizer set). Returns the seconds taken."""
    from kubernetes import client

    from backfill.controller.actor import FINALIZER
    from bench.bench_latency import create_model

    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    active = ts(last_active)

    def model(i: int) -> None:
        create_model(co, NS, i, active)

    def backfill(i: int) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ModelBackfill",
            "metadata": {"name": f"bf-{i:05d}", "finalizers": [FINALIZER]},
            "spec": {"modelRef": f"m-{i % models:05d}", "templateRef": TEMPLATE, "idleFor": "30m", "maxRunDuration": "15m"},
        }
        co.create_namespaced_custom_object(GROUP, VERSION, NS, "modelbackfills", body, _preload_content=False)

    t = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(model, range(models)))
        list(pool.map(backfill, range(backfills)))
    return time.monotonic() - t


def list_objects(api: Any, plural: str) -> list[dict[str, Any]]:
    from kubernetes import client

    co = client.CustomObjectsApi(api)
    return json.loads(co.list_namespaced_custom_object(GROUP, VERSION, NS, plural, _preload_content=False).data)["items"]


# --------------------------------------------------------------------------- the log


def _templates(granularity: float) -> tuple[Any, Any]:
    """Encoders of the two hot events: the encoder's own JSON with the times substituted."""
    from backfill.core import events as ev
    from backfill.core.records import EventRecord
    from backfill.core.timefmt import rfc3339

    s_at = datetime(2001, 2, 3, 4, 5, 6, tzinfo=timezone.utc)
    s_busy = datetime(2001, 2, 3, 4, 5, 7, tzinfo=timezone.utc)
    pad = timedelta(seconds=granularity)
    cache: dict[tuple[str, str], tuple[str, str]] = {}

    def fr(ns: str, model: str, uid: str, at: datetime) -> EventRecord:
        tpl = cache.get(("fr", model))
        if tpl is None:
            r = ev.encode(ev.ForegroundRequest(at=s_at, namespace=ns, model=model, source="lastActiveTime", busy_until=s_busy if pad else None), "k")
            tpl = cache[("fr", model)] = (r.stream, r.data)
        raw = rfc3339(at)
        data = tpl[1].replace(rfc3339(s_at), raw)
        if pad:
            data = data.replace(rfc3339(s_busy), rfc3339(at + pad))
        return EventRecord("ForegroundRequest", 1, tpl[0], f"fg/{uid}/{raw}", at, data)

    def ready(ns: str, model: str, uid: str, node: str, rv: str, at: datetime) -> EventRecord:
        tpl = cache.get(("ready", model))
        if tpl is None:
            r = ev.encode(ev.ModelReady(at=s_at, namespace=ns, model=model, node=node, shared=""), "k")
            tpl = cache[("ready", model)] = (r.stream, r.data)
        return EventRecord("ModelReady", 1, tpl[0], f"model/{uid}/{rv}/ready", at, tpl[1].replace(rfc3339(s_at), rfc3339(at)))

    return fr, ready


def build_log(models: list[dict], backfills: list[dict], total: int, last_active: datetime, granularity: float) -> Iterator[list[Any]]:
    """Batches of EventRecords (about ``total`` in all), oldest first, as described in the module
    docstring; the tail is the watchers' own translation of the objects as listed now."""
    from backfill.controller.translate import Translator, model_node
    from backfill.core import events as ev
    from backfill.core.events import encode

    fr, ready = _templates(granularity)
    start = last_active - timedelta(days=30)
    translator = Translator(None, signal_granularity=granularity)
    head: list[Any] = []
    old = {"metadata": {"namespace": NS, "name": TEMPLATE, "uid": "00000000-0000-4000-8000-000000000001", "resourceVersion": "1"}, "spec": template_body()["spec"]}
    head += [encode(e, k) for e, k in translator.cronjob("ADDED", old, start)]
    for m in models:
        seen = {**m, "metadata": {**m["metadata"], "resourceVersion": "0"}, "status": {"phase": "Ready"}}  # first seen, before any bump
        head += [encode(e, k) for e, k in translator.model("ADDED", seen, start)]
    for b in backfills:
        head += [encode(e, k) for e, k in translator.backfill("ADDED", b, start + timedelta(seconds=1))]
    head += [encode(e, k) for e, k in translator.cronjob("DELETED", old, start + timedelta(days=1))]
    tail: list[Any] = []
    now = last_active + timedelta(seconds=granularity + 1)
    for m in models:
        tail += [encode(e, k) for e, k in translator.model("MODIFIED", m, now)]
    idents = [(m["metadata"]["name"], m["metadata"]["uid"], model_node(m)) for m in models]
    bumps = max(0, (total - len(head) - len(tail)) // 2)
    first, span = start + timedelta(days=1, seconds=1), (last_active - start - timedelta(days=1, minutes=1)).total_seconds()
    step = span / max(1, bumps)
    # the substituted rows equal the encoder's (a sample)
    name, uid, node = idents[0]
    at = first.replace(microsecond=0)
    busy = at + timedelta(seconds=granularity) if granularity else None
    expected = encode(ev.ForegroundRequest(at=at, namespace=NS, model=name, source="lastActiveTime", busy_until=busy), f"fg/{uid}/{ts(at)}")
    assert fr(NS, name, uid, at) == expected, (fr(NS, name, uid, at), expected)
    assert ready(NS, name, uid, node, "h0", at) == encode(ev.ModelReady(at=at, namespace=NS, model=name, node=node, shared=""), f"model/{uid}/h0/ready")
    yield head
    batch: list[Any] = []
    n = len(idents)
    for i in range(bumps):
        name, uid, node = idents[i % n]
        at = (first + timedelta(seconds=int(i * step))).replace(microsecond=0)
        batch.append(ready(NS, name, uid, node, f"h{i}", at))
        batch.append(fr(NS, name, uid, at))
        if len(batch) >= BATCH:
            yield batch
            batch = []
    yield batch + tail


def write_log(url: str, schema: str, batches: Iterator[list[Any]]) -> tuple[int, float, dict[str, int]]:
    """Append every batch; returns (events, seconds, events per type)."""
    from backfill.store import EventStore, make_engine

    engine = make_engine(url, schema, pool_size=2)
    store = EventStore(engine)
    n, mix = 0, {}
    t = time.monotonic()
    try:
        for b in batches:
            for s in range(0, len(b), BATCH):
                store.append(b[s : s + BATCH])
            n += len(b)
            for r in b:
                mix[r.type] = mix.get(r.type, 0) + 1
    finally:
        store.close()
        engine.dispose()
    return n, time.monotonic() - t, mix


# --------------------------------------------------------------------------- the controller's process


def child_main() -> int:
    """The process hosting one Controller (``--child``); JSON lines on stdout, one command
    (``stop``) on stdin. Configured by the environment of :func:`spawn`."""
    import logging
    import resource

    import psutil

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    env = os.environ
    phase, idle = env["BENCH_SCALE_PHASE"], float(env["BENCH_SCALE_IDLE"])
    quiet_timeout, settle = float(env["BENCH_SCALE_QUIET_TIMEOUT"]), float(env["BENCH_SCALE_SETTLE"])

    def out(**kw: Any) -> None:
        print(json.dumps(kw), flush=True)

    from backfill.controller import loop
    from backfill.controller.loop import Controller
    from backfill.controller.metrics import Metrics
    from backfill.settings import Settings
    from backfill.store import EventStore, RunStore, make_engine

    try:
        from backfill.core.perf import freeze_heap
    except ImportError:  # an older checkout (this child runs against earlier commits too)
        freeze_heap = None
    first_full = threading.Event()
    if hasattr(Controller, "step"):  # observe the first full pass (the controller's code is unchanged)
        original = Controller.step

        def step(self: Any, keys: Any, *a: Any, **kw: Any) -> Any:
            result = original(self, keys, *a, **kw)
            if keys is None:
                first_full.set()
            return result

        loop.Controller.step = step  # type: ignore[method-assign]
    settings = Settings(namespace=NS)
    engine = make_engine(env["BENCH_SCALE_URL"], env["BENCH_SCALE_SCHEMA"])
    events = EventStore(engine, poll=settings.poll_fallback_seconds)
    api = api_client(env["BENCH_SCALE_HOST"], env["BENCH_SCALE_TOKEN"], env["BENCH_SCALE_CA"], pool=40)
    proc = psutil.Process()
    import gc

    gc.collect()
    rss0 = proc.memory_info().rss
    controller = Controller(settings, api, events, RunStore(engine), Metrics(), leader=None, identity=f"bench-{phase}")
    t0 = time.monotonic()
    controller.start()
    refold_s = time.monotonic() - t0
    loaded = getattr(controller, "snapshot_position", None)  # the snapshot start() loaded (0: none)
    deadline = t0 + 600
    while not controller.synced and time.monotonic() < deadline:
        time.sleep(0.005)
    synced_s = time.monotonic() - t0
    freeze_s = 0.0
    if freeze_heap is not None:  # what ``backfill controller`` does once its watchers synced
        t = time.monotonic()
        freeze_heap()
        freeze_s = time.monotonic() - t
    if hasattr(Controller, "step"):
        first_full.wait(max(0.0, deadline - time.monotonic()))
    else:  # no step(): two completed passes after synced
        seen = controller.last_pass
        for _ in range(2):
            while controller.last_pass == seen and time.monotonic() < deadline:
                time.sleep(0.005)
            seen = controller.last_pass
    ready_s = time.monotonic() - t0
    out(phase=phase, refold_s=refold_s, synced_s=synced_s, freeze_s=freeze_s, cold_start_s=ready_s, position=controller.position, loaded=loaded,
        backfills=len(controller.world.backfills), models=len(controller.world.models), rss_start=proc.memory_info().rss)
    # settle: the status writer idle (when the actor has one) and the log idle for `settle` seconds
    t = time.monotonic()
    writer = getattr(getattr(controller, "actor", None), "statuses", None)
    last, still = controller.position, time.monotonic()
    while time.monotonic() - t < quiet_timeout:
        time.sleep(0.2)
        if controller.position != last:
            last, still = controller.position, time.monotonic()
        elif time.monotonic() - still >= settle and (writer is None or writer.idle(0)):
            break
    out(quiet_s=time.monotonic() - t, position=controller.position, snapshot=getattr(controller, "snapshot_position", None))
    if phase == "cold" and idle > 0:
        c0, w0 = proc.cpu_times(), time.monotonic()
        time.sleep(idle)
        c1, w1 = proc.cpu_times(), time.monotonic()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        gc.collect()
        rss1 = proc.memory_info().rss
        out(idle_s=w1 - w0, idle_cpu_s=cpu, idle_cpu_pct=100.0 * cpu / (w1 - w0), rss0=rss0, rss1=rss1,
            peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, threads=threading.active_count())
    out(ready=True)
    if phase == "cold":
        sys.stdin.readline()  # the parent says when the admissions are done
    controller.stop()
    events.close()
    engine.dispose()
    api.close()
    out(stopped=True, position=controller.position)
    return 0


class Child:
    """A child process hosting the controller (:func:`child_main`), read line by line."""

    def __init__(self, phase: str, cluster: Any, url: str, schema: str, idle: float, quiet_timeout: float, settle: float) -> None:
        env = dict(os.environ)
        env.update(
            BENCH_SCALE_PHASE=phase, BENCH_SCALE_IDLE=str(idle), BENCH_SCALE_QUIET_TIMEOUT=str(quiet_timeout), BENCH_SCALE_SETTLE=str(settle),
            BENCH_SCALE_URL=url, BENCH_SCALE_SCHEMA=schema, BENCH_SCALE_HOST=cluster.host,
            BENCH_SCALE_TOKEN=cluster.token, BENCH_SCALE_CA=cluster.ca_file, PYTHONWARNINGS="ignore",
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child"], env=env, cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.info: dict[str, Any] = {}

    def until(self, key: str, timeout: float) -> dict[str, Any]:
        """Read lines until one has ``key``; every line's fields are merged into :attr:`info`."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the controller's process exited ({self.proc.wait()}) before reporting {key}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self.info.update(msg)
            if key in msg:
                return msg
        raise SystemExit(f"timed out waiting for the controller's process to report {key}")

    def finish(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.until("stopped", timeout)
            except (BrokenPipeError, SystemExit):
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# --------------------------------------------------------------------------- admissions


def read_audit(path: Path) -> tuple[float | None, list[float]]:
    """(CronJob create time, sorted Job create times) in NS, ``ResponseComplete``, epoch seconds."""
    from bench.bench_latency import audit_entries, parse_ts

    cron, jobs = None, []
    for e in audit_entries(path):
        ref = e.get("objectRef") or {}
        if e.get("verb") != "create" or ref.get("namespace") != NS or not 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300:
            continue
        at = parse_ts(e["stageTimestamp"])
        if ref.get("resource") == "cronjobs" and ref.get("name") == TEMPLATE:
            cron = at if cron is None else min(cron, at)
        elif ref.get("resource") == "jobs":
            jobs.append(at)
    return cron, sorted(jobs)


def admissions(api: Any, models: int, audit_path: Path, timeout: float, settle: float) -> dict[str, Any]:
    """Create the template; wait for one Job per Model; the audit log's span of it."""
    from kubernetes import client

    from backfill.core.jobtemplate import BACKFILL_LABEL

    batch = client.BatchV1Api(api)
    batch.create_namespaced_cron_job(NS, template_body(), _preload_content=False)
    t = time.monotonic()
    count = 0
    while time.monotonic() - t < timeout:
        items = json.loads(batch.list_namespaced_job(NS, label_selector=BACKFILL_LABEL, _preload_content=False).data)["items"]
        count = len(items)
        if count >= models:
            break
        time.sleep(0.25)
    time.sleep(settle)  # anything beyond one per Model would show now
    items = json.loads(batch.list_namespaced_job(NS, label_selector=BACKFILL_LABEL, _preload_content=False).data)["items"]
    per_model: dict[str, int] = {}
    for j in items:
        name = (j["metadata"].get("labels") or {}).get(BACKFILL_LABEL, "")
        m = int(name[3:]) % models if name.startswith("bf-") and name[3:].isdigit() else -1
        per_model[str(m)] = per_model.get(str(m), 0) + 1
    cron, jobs = read_audit(audit_path)
    after = [j - cron for j in jobs] if cron is not None else []
    done = len(after) >= models
    span = after[models - 1] if done else (time.monotonic() - t if cron is not None else None)
    quantiles = ", ".join(f"{q}% {after[min(len(after) - 1, int(len(after) * q / 100))]:.1f} s" for q in (10, 50, 90)) if after else "none"
    return {"jobs": len(items), "models_with_job": len(per_model), "max_per_model": max(per_model.values(), default=0),
            "span": span, "done": done, "created": len(after), "quantiles": quantiles,
            "first": after[0] if after else None}


# --------------------------------------------------------------------------- the run


def run(
    models: int = 1000,
    backfills: int = 10000,
    log_events: int = 5_000_000,
    idle: float = 60.0,
    database_url: str | None = None,
    workers: int = 16,
    cluster: Any = None,
    audit_path: Path | None = None,
    settle: float = 3.0,
    admission_timeout: float = 300.0,
    settle_timeout: float = 480.0,
) -> list[Row]:
    """The whole benchmark (module docstring); a given ``cluster`` (with the CRDs and
    ``bench_latency.AUDIT_POLICY`` at ``audit_path``) is used instead of starting one."""
    from backfill.settings import Settings
    from backfill.store import resolve_database_url, upgrade

    settings_kw = {"database_url": database_url} if database_url else {}
    settings = Settings(namespace=NS, **settings_kw)
    url, _ = resolve_database_url(settings)
    schema = f"bench_{secrets.token_hex(4)}"
    upgrade(url, schema)
    own = cluster is None
    audit_dir = Path(tempfile.mkdtemp(prefix="backfill-bench-scale-")) if own else None
    children: list[Child] = []
    size = f"{backfills:,} ModelBackfills on {models:,} Models, {log_events:,}-event log"
    try:
        if own:
            assert audit_dir is not None
            cluster = start_cluster(audit_dir)
            audit_path = audit_dir / "audit.log"
        assert audit_path is not None
        api = api_client(cluster.host, cluster.token, cluster.ca_file, pool=workers + 4)
        last_active = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)
        create_s = create_objects(api, models, backfills, last_active, workers)
        say(f"scale: created {models:,} Models and {backfills:,} ModelBackfills in {create_s:.1f} s")
        ms, bs = list_objects(api, "models"), list_objects(api, "modelbackfills")
        n, write_s, mix = write_log(url, schema, build_log(ms, bs, log_events, last_active, settings.foreground_signal_granularity_seconds))
        total_mix = sum(mix.values()) or 1
        mix_note = ", ".join(f"{k} {v / total_mix:.1%}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:3])
        say(f"scale: wrote {n:,} events in {write_s:.1f} s ({n / write_s:,.0f}/s; {mix_note})")

        first = Child("first", cluster, url, schema, 0, quiet_timeout=settle_timeout, settle=settle)
        children.append(first)
        f1 = first.until("cold_start_s", 900)
        first.until("ready", settle_timeout + 120)
        first.finish()
        say(f"scale: first start {f1['cold_start_s']:.1f} s (refold {f1['refold_s']:.1f} s, position {f1['position']:,}); settled "
            f"{first.info.get('quiet_s', 0):.1f} s later")

        cold = Child("cold", cluster, url, schema, idle, quiet_timeout=300, settle=settle)
        children.append(cold)
        c1 = cold.until("cold_start_s", 900)
        say(f"scale: cold start {c1['cold_start_s']:.1f} s (refold {c1['refold_s']:.1f} s, synced {c1['synced_s']:.1f} s)")
        idle_info = cold.until("ready", 900 + idle)
        idle_info = cold.info
        say(f"scale: idle CPU {idle_info.get('idle_cpu_pct', float('nan')):.2f}% over {idle_info.get('idle_s', 0):.0f} s")
        adm = admissions(api, models, audit_path, timeout=admission_timeout, settle=settle)
        cold.finish()
        say(f"scale: {adm['jobs']} Jobs on {adm['models_with_job']} Models (at most {adm['max_per_model']} per Model); "
            f"{adm['created']} created, the {models}th {adm['span']:.1f} s after the CronJob ({adm['quantiles']})")
        api.close()
    finally:
        for c in children:
            c.finish(10)
        from bench.bench_latency import teardown

        teardown(cluster if own else None, url, schema, audit_dir)
    mb = 1 / 2**20
    info = cold.info
    loaded = c1.get("loaded")
    how = ("no snapshots in this build" if loaded is None else f"the snapshot at position {loaded:,} loaded, the tail folded" if loaded
           else "no snapshot found: the whole log folded")
    return [
        Row(
            "scale: cold start (synced + first reconcile pass)",
            c1["cold_start_s"],
            "s",
            baseline=f1["cold_start_s"],
            baseline_name="first start",
            target=COLD_START_TARGET,
            higher_is_better=False,
            note=f"{size}; a fresh process: start() ({how}) {c1['refold_s']:.1f} s, "
            f"watchers synced {c1['synced_s']:.1f} s, start-up heap frozen in {c1.get('freeze_s', 0.0):.2f} s (as backfill "
            f"controller does), first full pass done {c1['cold_start_s']:.1f} s after start(), position "
            f"{c1['position']:,}. Baseline: the first start on the same log, before any start-up had run on it "
            f"(whole log folded in start() {f1['refold_s']:.1f} s; snapshot it left: {first.info.get('snapshot')}). "
            f"Log: {mix_note}, written in {write_s:.0f} s",
        ),
        Row(
            "scale: first start until every status is written",
            f1["cold_start_s"] + first.info.get("quiet_s", float("nan")),
            "s",
            note=f"{size}; the first start (whole log folded) until its status writer is idle and the log idle for {settle:g} s "
            f"(one status write per ModelBackfill: about {backfills / max(1e-9, first.info.get('quiet_s', 0)):,.0f} ModelBackfills/s after the "
            f"first pass, the settle wait included; bounded at {settle_timeout:.0f} s); no target",
        ),
        Row(
            "scale: idle CPU",
            info.get("idle_cpu_pct"),
            "%",
            target=IDLE_CPU_TARGET,
            higher_is_better=False,
            note=f"{size}; user + system CPU time of the process hosting only the controller over {info.get('idle_s', 0):.0f} s "
            f"after the log went idle ({info.get('idle_cpu_s', 0):.2f} CPU-s; % of one core; {info.get('threads', '?')} threads)",
        ),
        Row(
            "scale: resident memory attributable to the controller",
            (info["rss1"] - info["rss0"]) * mb if "rss1" in info else None,
            "MB",
            target=MEMORY_TARGET,
            higher_is_better=False,
            note=f"{size}; RSS after the idle period minus RSS just before the Controller was built (interpreter, imports, "
            f"settings and API client loaded: {info.get('rss0', 0) * mb:.0f} MB); whole process {info.get('rss1', 0) * mb:.0f} MB, "
            f"peak {info.get('peak', 0) * mb:.0f} MB (ru_maxrss, during start-up)",
        ),
        Row(
            "scale: admissions due at once (one per Model), all created",
            adm["span"],
            "s",
            target=ADMISSIONS_TARGET,
            higher_is_better=False,
            note=f"{size}; the template CronJob created (it unblocks every ModelBackfill at once) -> the {models:,}th Job create, "
            f"both ResponseComplete in the audit log"
            + ("" if adm["done"] else f"; NOT ALL CREATED: {adm['created']} of {models} within the {admission_timeout:.0f} s allowed "
               "(the value is that bound)")
            + f"; Job creates after the CronJob at the 10th/50th/90th percentile: {adm['quantiles']}; {adm['jobs']} Jobs on "
            f"{adm['models_with_job']} Models, at most {adm['max_per_model']} per Model",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--backfills", type=int, default=10000)
    parser.add_argument("--log-events", type=int, default=5_000_000)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU measurement (default 60)")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds the log must stay idle to count as settled (default 3)")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main()
    from rich.console import Console
    from rich.table import Table

    from bench.rows import COLUMNS

    rows = run(args.models, args.backfills, args.log_events, args.idle, args.database_url, args.workers, settle=args.settle)
    table = Table(title="controller at scale")
    for c in COLUMNS:
        table.add_column(c)
    for r in rows:
        table.add_row(*r.cells())
    Console(width=160).print(table)
    for r in rows:
        print(f"- {r.name}: {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
