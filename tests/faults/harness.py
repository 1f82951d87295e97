"""Fault-injection harness: the controller as a real subprocess, the test as the Job controller,
and readers of the outcome that never look at the controller's own view.

    proc = ControllerProcess(kubeconfig=..., database_url=..., schema=..., namespace=ns)
    proc.start(); proc.wait_ready()
    proc.kill()          # SIGKILL: no clean shutdown, no lease release
    proc.start()         # the same command line, port and identity again
    proc.logs()          # the JSON log lines it wrote (one dict per line)

Outcome readers: :func:`log_events` (the log, decoded, from PostgreSQL), :func:`run_rows`
(the ``runs`` table), :func:`replay` (``backfill replay`` as a subprocess: exit code and output).
The test plays the Job controller with :class:`JobPlayer` (status subresource writes) and the
garbage collector with :meth:`JobPlayer.collect_garbage` (no controller-manager runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kubernetes.client.exceptions import ApiException

from tests.controller.conftest import Kube, now_s, ts, wait_for
from tests.envtest.cluster import free_port

__all__ = [
    "ControllerProcess",
    "JobPlayer",
    "Kube",
    "FAST_SETTINGS",
    "log_events",
    "run_rows",
    "replay",
    "now_s",
    "ts",
    "wait_for",
]

BIN = Path(sys.executable).parent / "backfill"

#: Short timings so every fault shows within seconds (environment of the controller process).
FAST_SETTINGS: dict[str, str] = {
    "BACKFILL_WATCH_TIMEOUT_SECONDS": "5",
    "BACKFILL_BACKOFF_INITIAL_SECONDS": "0.2",
    "BACKFILL_BACKOFF_MAX_SECONDS": "1",
    "BACKFILL_LEASE_DURATION_SECONDS": "3",
    "BACKFILL_LEASE_RENEW_SECONDS": "1",
    "BACKFILL_POLL_FALLBACK_SECONDS": "0.2",
    "BACKFILL_RESYNC_SECONDS": "60",
    "BACKFILL_WATCH_STALE_MARGIN_SECONDS": "2",
    "BACKFILL_API_TIMEOUT_SECONDS": "2",
    "BACKFILL_HEALTH_STALE_SECONDS": "20",
    "BACKFILL_DB_CONNECT_TIMEOUT_SECONDS": "2",
    # The tests bump lastActiveTime themselves, to the second: no padding of the busy span, so a
    # retry after a preemption needs exactly idleFor.
    "BACKFILL_FOREGROUND_SIGNAL_GRANULARITY_SECONDS": "0",
    # As in the Deployment: every replica takes part in leader election.
    "BACKFILL_LEADER_ELECT": "true",
}

STOP_TIMEOUT = 10.0  # seconds a SIGTERMed controller may take to exit
HTTP_TIMEOUT = 2.0  # seconds for a /readyz, /healthz or /metrics request


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass
class ControllerProcess:
    """``backfill controller`` as a child process, with its stderr/stdout in ``log_path``.

    Args:
        kubeconfig: the identity it talks to the apiserver as.
        database_url / schema: the store.
        namespace: the namespace it watches; the Lease is there too (``lease_name``).
        identity: its leader-election identity (``BACKFILL_IDENTITY``).
        env: extra environment (on top of :data:`FAST_SETTINGS`), e.g. ``{"TZ": "Europe/Berlin"}``.
    """

    kubeconfig: str
    database_url: str
    schema: str
    namespace: str
    log_path: Path
    identity: str = "replica-a"
    lease_name: str = "mbf-faults"
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(BIN), "controller",
            "--kubeconfig", self.kubeconfig,
            "--database-url", self.database_url,
            "--schema", self.schema,
            "--namespace", self.namespace,
            "--metrics-address", self.address,
            "--lease-name", self.lease_name,
            "--lease-namespace", self.namespace,
        ]  # fmt: skip

    def start(self) -> ControllerProcess:
        """Start (or start again) with the same command line, port and identity."""
        assert not self.alive, "already running"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")}
        env.update(FAST_SETTINGS, BACKFILL_IDENTITY=self.identity, **self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f'{{"msg": "--- harness: start #{self.starts + 1}", "harness": true}}\n'.encode())
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        self.starts += 1
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL and reap (a crash: nothing is flushed, the Lease is not released)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT)

    def terminate(self) -> int:
        """SIGTERM (a graceful stop) and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT)
            raise AssertionError(f"controller did not stop within {STOP_TIMEOUT} s of SIGTERM") from None

    def pause(self) -> None:
        """SIGSTOP the whole process (every thread): it holds whatever it held."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    # -- HTTP --------------------------------------------------------------------------------

    def http(self, path: str) -> tuple[int, str]:
        """(status, body) of GET ``path``; (0, error) when nothing answers in time."""
        try:
            with urllib.request.urlopen(f"http://{self.address}{path}", timeout=HTTP_TIMEOUT) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def ready(self) -> bool:
        return self.http("/readyz")[0] == 200

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for /readyz 200; fail with the end of the log when the process died or it did not come."""
        def check() -> bool:
            if not self.alive:
                raise AssertionError(f"controller exited ({self.proc.returncode if self.proc else None}):\n{self.tail()}")
            return self.ready()

        try:
            wait_for(check, timeout=timeout, interval=0.1, what=f"{self.identity} /readyz 200")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.tail()}") from None

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of the samples of ``name`` on /metrics (matching ``labels``); 0 when absent."""
        from prometheus_client.parser import text_string_to_metric_families

        status, body = self.http("/metrics")
        assert status == 200, f"/metrics answered {status}: {body[:200]}"
        total = 0.0
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                    total += s.value
        return total

    # -- log ---------------------------------------------------------------------------------

    def logs(self) -> list[dict[str, Any]]:
        """Every JSON object it logged (all starts), in order; non-JSON lines as ``{"raw": ...}``."""
        out: list[dict[str, Any]] = []
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                obj = {"raw": line}
            out.append(obj if isinstance(obj, dict) else {"raw": line})
        return out

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return f"--- last log lines of {self.identity}:\n" + "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- the test as Job controller


class JobPlayer:
    """Plays the Job controller and the garbage collector (no controller-manager runs)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def jobs(self) -> list[Any]:
        """The Jobs the controller owns (labelled), Terminating ones included."""
        return self.kube.jobs()

    def live(self) -> list[Any]:
        """Owned Jobs not being deleted and not finished."""
        out = []
        for j in self.jobs():
            st = j.status
            done = st is not None and any(c.type in ("Complete", "Failed") and c.status == "True" for c in st.conditions or [])
            if j.metadata.deletion_timestamp is None and not done:
                out.append(j)
        return out

    def run(self, name: str) -> None:
        """status.active = 1, startTime now."""
        self.kube.job_status(name, {"startTime": ts(now_s()), "active": 1})

    def succeed(self, name: str) -> None:
        """A Complete condition (and succeeded = 1)."""
        t = ts(now_s())
        self.kube.job_status(
            name,
            {
                "active": 0, "succeeded": 1, "completionTime": t, **self._start(name, t),
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": t},
                    {"type": "Complete", "status": "True", "lastTransitionTime": t},
                ],
            },
        )  # fmt: skip

    def fail(self, name: str, reason: str = "BackoffLimitExceeded") -> None:
        t = ts(now_s())
        self.kube.job_status(
            name,
            {
                "active": 0, "failed": 1, **self._start(name, t),
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": reason, "lastTransitionTime": t},
                    {"type": "Failed", "status": "True", "reason": reason, "lastTransitionTime": t},
                ],
            },
        )  # fmt: skip

    def _start(self, name: str, t: str) -> dict[str, str]:
        """``{"startTime": t}`` unless the Job has one already (it is immutable once set)."""
        job = self.kube.job(name)
        return {} if job is not None and job.status is not None and job.status.start_time else {"startTime": t}

    def collect_garbage(self) -> list[str]:
        """Delete every owned Job whose controller owner (a ModelBackfill uid) no longer exists;
        returns their names (what the garbage collector would do)."""
        uids = {
            o["metadata"]["uid"]
            for o in self.kube.custom.list_namespaced_custom_object("ai.flexinfer", "v1alpha2", self.kube.ns, "modelbackfills")["items"]
        }
        gone = []
        for j in self.jobs():
            owners = [o for o in j.metadata.owner_references or [] if o.controller]
            if owners and owners[0].uid not in uids:
                try:
                    self.kube.batch.delete_namespaced_job(j.metadata.name, self.kube.ns, propagation_policy="Background")
                    gone.append(j.metadata.name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        return gone

    def add_finalizer(self, name: str, finalizer: str = "faults.test/hold") -> None:
        self.kube.batch.patch_namespaced_job(name, self.kube.ns, {"metadata": {"finalizers": [finalizer]}})

    def remove_finalizers(self, name: str) -> None:
        try:
            self.kube.batch.patch_namespaced_job(name, self.kube.ns, {"metadata": {"finalizers": None}})
        except ApiException as exc:
            if exc.status != 404:
                raise


def demand(kube: Kube, model: str) -> str:
    """Foreground demand: bump the Model's ``status.lastActiveTime`` to now (whole seconds,
    strictly later than any earlier bump); returns the value written."""
    current = ((kube.get("models", model) or {}).get("status") or {}).get("lastActiveTime")
    t = now_s()
    if current is not None and current >= ts(t):
        from datetime import timedelta

        t = t + timedelta(seconds=1)
    kube.set_status("models", model, {"lastActiveTime": ts(t)})
    return ts(t)


# --------------------------------------------------------------------------- the outcome, from the log


def log_events(url: str, schema: str) -> list[tuple[int, Any]]:
    """Every event in the log as ``(position, event)`` (decoded), read from PostgreSQL."""
    from backfill.core.events import decode_many
    from backfill.store import EventStore, make_engine

    engine = make_engine(url, schema)
    store = EventStore(engine)
    out: list[tuple[int, Any]] = []
    try:
        for batch in store.read_payloads(0):
            out.extend(zip([p for p, *_ in batch], decode_many([(t, v, d) for _, t, v, d in batch])))
    finally:
        store.close()
        engine.dispose()
    return out


def of_type(events: list[tuple[int, Any]], *names: str) -> list[tuple[int, Any]]:
    return [(p, e) for p, e in events if type(e).__name__ in names]


def run_rows(url: str, schema: str) -> list[Any]:
    """The ``runs`` table (one row per attempt), oldest first."""
    from backfill.store import RunStore, make_engine

    engine = make_engine(url, schema)
    try:
        return list(RunStore(engine).query())
    finally:
        engine.dispose()


def replay(url: str, schema: str, timeout: float = 120.0) -> tuple[int, str]:
    """``backfill replay --limit 0`` as a subprocess: (exit code, stdout+stderr)."""
    proc = subprocess.run(
        [str(BIN), "replay", "--database-url", url, "--schema", schema, "--limit", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
        env={k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")},
    )  # fmt: skip
    return proc.returncode, proc.stdout


def assert_replay_clean(url: str, schema: str) -> str:
    """``backfill replay`` exits 0 (no divergent decision); returns its output."""
    rc, out = replay(url, schema)
    assert rc == 0, f"backfill replay exit {rc}:\n{out[-3000:]}"
    return out


def timed(fn: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.02) -> float:
    """Seconds until ``fn()`` is truthy (fails naming ``what`` after ``timeout``)."""
    t0 = time.monotonic()
    wait_for(fn, timeout=timeout, interval=interval, what=what)
    return time.monotonic() - t0

