"""Fixtures and helpers for the controller tests on the real API server (tests/envtest)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

GROUP, VERSION = "ai.flexinfer", "v1alpha2"


def log_of(controller: Any) -> list[tuple[int, Any]]:
    """``(position, event)`` of every event in ``controller``'s log, decoded, in order."""
    from backfill.core.events import decode_many

    rows = list(controller.events.read(0))
    return list(zip((r.position for r in rows), decode_many([(r.type, r.version, r.data) for r in rows])))


class AdmissionPolicy:
    """A ValidatingAdmissionPolicy + binding (in-process CEL admission: no webhook server) that
    refuses ``operations`` on ``resource`` of API group ``group`` in namespace ``ns`` unless
    ``expression`` holds, answering ``reason`` (``Invalid``: 422, ``Forbidden``: 403) and
    ``message``. :meth:`remove` lifts it."""

    def __init__(self, api: client.ApiClient, ns: str, name: str, group: str, version: str, resource: str,
                 operations: list[str], expression: str, message: str, reason: str) -> None:  # fmt: skip
        self.ar, self.name = client.AdmissionregistrationV1Api(api), name
        self.ar.create_validating_admission_policy({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": [group], "apiVersions": [version], "operations": operations, "resources": [resource]}
                ]},
                "validations": [{"expression": expression, "message": message, "reason": reason}],
            },
        })  # fmt: skip
        self.ar.create_validating_admission_policy_binding({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}},
        })  # fmt: skip

    def remove(self) -> None:
        """Delete the binding and the policy (either may be gone already)."""
        for delete in (self.ar.delete_validating_admission_policy_binding, self.ar.delete_validating_admission_policy):
            try:
                delete(self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


class LeaderSwitch:
    """A leader elector stand-in for two controllers in one test: ``leading`` is the switch."""

    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def is_leader(self) -> bool:
        """Whether this replica leads now."""
        return self.leading


class RefusingStore:
    """A controller's EventStore, except that ``append`` raises while ``down`` is set (reads
    still answer): PostgreSQL refusing writes. With ``hang=True`` an append waits while ``down``
    is set instead, then goes through: a paused server, whose appends never answer (no error).
    Pass ``wrap_events=lambda s: RefusingStore(s, down)`` to ``start_controller``."""

    def __init__(self, store: Any, down: threading.Event, hang: bool = False) -> None:
        self._store, self._down, self._hang = store, down, hang

    def append(self, records: Any) -> Any:
        """The store's append, or ConnectionError (``hang``: a wait) while ``down`` is set."""
        while self._down.is_set():
            if not self._hang:
                raise ConnectionError("the store refuses appends (test outage)")
            time.sleep(0.02)
        return self._store.append(records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def wait_for(predicate: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.05, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for: {what} (last: {last!r})")


def now_s() -> datetime:
    """Now, whole seconds (as the API's timestamps)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    """Small helpers over one namespace: create the objects the tests need, read them back."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.api, self.ns = api, ns
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)

    # custom objects
    def create(self, plural: str, kind: str, name: str, spec: dict) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, plural, body)

    def get(self, plural: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, plural: str, name: str, body: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, plural, name, body)

    def set_status(self, plural: str, name: str, status: dict) -> dict:
        obj = self.get(plural, name)
        assert obj is not None
        obj["status"] = {**(obj.get("status") or {}), **status}
        return self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, self.ns, plural, name, obj)

    def model(self, name: str, node: str = "node-a", phase: str = "Ready", *, shared: str | None = None, **status: Any) -> dict:
        spec: dict = {"nodeSelector": {"kubernetes.io/hostname": node}}
        if shared is not None:
            spec["gpu"] = {"shared": shared}
        self.create("models", "Model", name, spec)
        return self.set_status("models", name, {"phase": phase, **status})

    def backfill(self, name: str, model: str = "gemma", template: str = "model-eval-gauntlet", **spec: Any) -> dict:
        body = {"modelRef": model, "templateRef": template, "idleFor": "2s", "maxRunDuration": "15m", **spec}
        return self.create("modelbackfills", "ModelBackfill", name, body)

    def status(self, name: str) -> dict:
        obj = self.get("modelbackfills", name)
        return (obj or {}).get("status") or {}

    def cronjob(
        self, name: str, *, env: list | None = None, resources: dict | None = None, init: bool = False, pod: dict | None = None
    ) -> None:
        """A suspended CronJob; ``pod`` (a whole pod spec) replaces the default two-container one."""
        if pod is None:
            container: dict = {"name": "main", "image": "busybox", "command": ["true"]}
            if env is not None:
                container["env"] = env
            if resources is not None:
                container["resources"] = resources
            pod = {"restartPolicy": "Never", "containers": [container, {"name": "side", "image": "busybox"}]}
            if init:
                pod["initContainers"] = [{"name": "prep", "image": "busybox", "env": [{"name": "A", "value": "1"}]}]
        body = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": name},
            "spec": {
                "schedule": "0 0 1 1 *",
                "suspend": True,
                "jobTemplate": {"metadata": {"labels": {"app": "gauntlet"}}, "spec": {"backoffLimit": 0, "template": {"spec": pod}}},
            },
        }
        self.batch.create_namespaced_cron_job(self.ns, body)

    # jobs
    def jobs(self) -> list:
        return self.batch.list_namespaced_job(self.ns, label_selector="modelbackfill.ai.flexinfer/name").items

    def job(self, name: str):
        try:
            return self.batch.read_namespaced_job(name, self.ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def job_going(self, name: str) -> bool:
        """Job ``name`` is gone or being deleted (one read: two reads raced a deletion between
        them, and the second found nothing to ask ``.metadata`` of)."""
        job = self.job(name)
        return job is None or job.metadata.deletion_timestamp is not None

    def job_status(self, name: str, status: dict) -> None:
        """Play the Job controller: write ``status`` on the Job."""
        job = self.batch.read_namespaced_job(name, self.ns)
        body = self.api.sanitize_for_serialization(job)
        body["status"] = {**(body.get("status") or {}), **status}
        self.batch.replace_namespaced_job_status(name, self.ns, body)

    def run_job(self, name: str) -> None:
        self.job_status(name, {"startTime": ts(now_s()), "active": 1})

    def hold_job(self, name: str) -> None:
        """Play a slow garbage collector: a finalizer keeps the Job, once deleted, terminating
        (``deletionTimestamp`` set) until :meth:`release_job`."""
        self.batch.patch_namespaced_job(name, self.ns, {"metadata": {"finalizers": [HOLD]}})

    def release_job(self, name: str) -> None:
        """Drop :meth:`hold_job`'s finalizer: a Job being deleted then goes."""
        self.batch.patch_namespaced_job(name, self.ns, {"metadata": {"finalizers": None}})


#: The finalizer :meth:`Kube.hold_job` puts on a Job (a test playing a slow garbage collector).
HOLD = "test.flexinfer/hold"


class PhaseRecorder:
    """Watches one ModelBackfill and records every status.phase it goes through (``phases``),
    and every ``(phase, jobName)`` (``statuses``)."""

    def __init__(self, api: client.ApiClient, ns: str, name: str) -> None:
        self.phases: list[str] = []
        self.statuses: list[tuple[str, str | None]] = []
        self._stop = threading.Event()
        self._api, self._ns, self._name = api, ns, name
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        co = client.CustomObjectsApi(self._api)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for e in w.stream(
                    co.list_namespaced_custom_object, GROUP, VERSION, self._ns, "modelbackfills",
                    field_selector=f"metadata.name={self._name}", timeout_seconds=2, deserialize=False,
                ):
                    status = e["object"].get("status") or {}
                    phase = status.get("phase")
                    if phase and (not self.phases or self.phases[-1] != phase):
                        self.phases.append(phase)
                    if phase and (not self.statuses or self.statuses[-1] != (phase, status.get("jobName"))):
                        self.statuses.append((phase, status.get("jobName")))
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001
                time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


NODE_SIGNALS = ("gamingsessions", "gpuleases")


def drop_node_signals(api: client.ApiClient, ns: str) -> None:
    """Delete every GamingSession and GPULease of ``ns`` (finalizers cleared first).

    They are node-level signals, watched in every namespace even by a namespaced controller,
    and a namespace deleted here stays Terminating with its objects (no controller-manager): a
    session or lease a test leaves behind on a shared node name ("node-a") would hold the
    Models of every later test on that node."""
    custom = client.CustomObjectsApi(api)
    for plural in NODE_SIGNALS:
        for obj in custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"]:
            name = obj["metadata"]["name"]
            try:
                if obj["metadata"].get("finalizers"):
                    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, plural, name, {"metadata": {"finalizers": None}})
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def kube(kube_api, kube_namespace):
    """:class:`Kube` on the test's namespace; its GamingSessions and GPULeases are deleted after."""
    yield Kube(kube_api, kube_namespace)
    drop_node_signals(kube_api, kube_namespace)


@pytest.fixture
def start_controller(kube_cluster, kube_namespace, pg_schema):
    """``start_controller(leader=None, wrap_events=None, **settings) -> Controller`` on the test
    namespace and a fresh schema; ``wrap_events(EventStore)`` returns the store the controller
    gets (e.g. one that refuses appends on demand)."""
    from backfill.controller.loop import Controller
    from backfill.controller.metrics import Metrics
    from backfill.settings import Settings
    from backfill.store import EventStore, RunStore, make_engine

    url, schema = pg_schema
    started: list = []

    def start(leader: Any = None, *, wrap_events: Callable[[Any], Any] | None = None, **overrides: Any) -> Controller:
        values: dict[str, Any] = dict(
            namespace=kube_namespace,
            watch_timeout_seconds=5,
            backoff_initial_seconds=0.2,
            backoff_max_seconds=2,
            resync_seconds=30,
        )
        settings = Settings(**{**values, **overrides})  # any setting may be overridden
        engine = make_engine(url, schema)
        events = EventStore(engine, poll=0.2)
        api = kube_cluster.api_client()
        store = wrap_events(events) if wrap_events is not None else events
        c = Controller(settings, api, store, RunStore(engine), Metrics(), leader=leader, identity=f"test-{len(started)}")
        c.start()
        started.append((c, events, engine, api))
        wait_for(lambda: c.synced, timeout=10, what="watchers synced")
        return c

    yield start
    for c, events, engine, api in started:
        c.stop()
        assert not [t.name for t in c.watchers if t.is_alive()], "watcher threads did not stop"
        events.close()
        engine.dispose()
        api.close()
    if started:
        assert_replays_clean(url, schema)


def assert_replays_clean(url: str, schema: str) -> None:
    """Every decision the controller recorded is what the projector derives on replay."""
    from backfill.core.audit import Auditor
    from backfill.core.events import decode_many
    from backfill.store import EventStore, make_engine

    engine = make_engine(url, schema)
    store = EventStore(engine)
    auditor = Auditor()
    try:
        for batch in store.read_payloads(0):
            for (position, *_), event in zip(batch, decode_many([(t, v, d) for _, t, v, d in batch])):
                auditor.feed(position, event)
    finally:
        store.close()
        engine.dispose()
    assert auditor.divergences == [], f"replay diverges: {auditor.divergences[:3]}"
    assert auditor.unverifiable == []
