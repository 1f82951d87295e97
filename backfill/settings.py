"""All tunables in one typed, documented settings object.

Values come from (highest first) command-line flags, environment variables prefixed
``BACKFILL_`` and the defaults below. Durations are seconds (floats) inside; the CLI accepts the
Kubernetes/Go syntax (``90s``, ``30m``) where it says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BACKFILL_"
#: The longest any ``*_seconds`` setting may be (about 31 years): longer ones overflow the
#: platform's socket and thread timeouts (CPython holds a timeout as int64 nanoseconds, about
#: 292 years, and a socket's timeval fails well before: 1e10 s is "timestamp out of range for
#: platform time_t"), and no timeout or period of a controller needs more.
MAX_SECONDS = 1_000_000_000
#: PostgreSQL's largest lock_timeout, statement_timeout and idle_in_transaction_session_timeout:
#: INT_MAX milliseconds (pg_settings.max_val 2147483647, unit ms); a larger value is refused by
#: the server ("Value exceeds integer range") on every connection.
PG_MAX_TIMEOUT_SECONDS = 2147483.647


class SettingsCheckError(ValueError):
    """A model-level check of :class:`Settings` that involves ``fields`` (field names); the
    message says the problem without naming them (:func:`describe_error` names them)."""

    def __init__(self, fields: tuple[str, ...], problem: str) -> None:
        super().__init__(f"{', '.join(fields)}: {problem}")
        self.fields = fields
        self.problem = problem


def env_name(field: str) -> str:
    """The environment variable of a :class:`Settings` field: ``BACKFILL_<FIELD>``."""
    return f"{ENV_PREFIX}{field.upper()}"


def describe_error(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """One line naming, for every problem of a :class:`Settings` validation error, where the
    value came from and what is wrong with it, such as
    ``BACKFILL_RESYNC_SECONDS: Input should be a valid number, unable to parse string as a number``.

    ``flags`` maps a field set by a command-line flag to that flag (``{"namespace":
    "--namespace"}``): such a field is named by its flag, every other by its environment
    variable. A model-level check names every field it involves (``BACKFILL_TLS_CERT_FILE,
    BACKFILL_TLS_KEY_FILE: must be set together``). Problems are joined by ``; ``.
    """
    flags = flags or {}
    parts = []
    for e in exc.errors(include_url=False, include_input=False):
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, SettingsCheckError):
            fields, problem = cause.fields, cause.problem
        else:
            fields = tuple(str(x) for x in e["loc"][:1])
            problem = str(cause) if e["type"] == "value_error" and cause is not None else e["msg"]
        names = ", ".join(flags.get(f) or env_name(f) for f in fields)
        parts.append(f"{names}: {problem}" if names else problem)
    return "; ".join(parts)


#: An RFC 1123 label (a namespace's name) and subdomain (a Lease's name), as the API server checks them.
_RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_RFC1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

#: The most bytes read from ``database_url_file`` (a URL is far shorter).
_URL_FILE_MAX = 64 * 1024


class Settings(BaseSettings):
    """Controller and CLI settings.

    Environment: every field can be set as ``BACKFILL_<FIELD_NAME_UPPERCASE>``, for example
    ``BACKFILL_DATABASE_URL=postgresql+psycopg://user:pw@host/db``.

    Every number is finite (``inf`` and ``nan`` are refused: an infinite timeout overflowed every
    watcher's socket timeout) and every ``*_seconds`` setting is at most :data:`MAX_SECONDS`.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", allow_inf_nan=False)

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the PostgreSQL server (postgresql+psycopg://...). "
        "Unset: database_url_file, else an embedded PostgreSQL server is started in data_dir.",
    )
    database_url_file: Path | None = Field(
        default=None,
        description="File holding the database URL (a mounted Secret), read when database_url is unset; "
        "surrounding whitespace is ignored.",
    )
    data_dir: Path = Field(
        default=Path(".backfill"),
        description="Where the embedded PostgreSQL server keeps its data when database_url is unset.",
    )

    # Kubernetes
    kubeconfig: Path | None = Field(default=None, description="kubeconfig file; unset: $KUBECONFIG (files merged as kubectl does; none existing is an error), else in-cluster, else ~/.kube/config.")
    namespace: str | None = Field(
        default=None,
        description="Watch, decide and act only in this namespace (an RFC 1123 label; GamingSessions and GPULeases are "
        "node-level signals and still watched in every namespace); unset: all namespaces.",
    )

    # HTTP
    metrics_address: str = Field(default="0.0.0.0:8080", description="host:port for /metrics, /healthz, /readyz and /v1/foreground.")
    ingest_token_file: Path | None = Field(default=None, description="File holding the bearer token for POST /v1/foreground (mounted from a Secret). Unset: ingest disabled.")
    tls_cert_file: Path | None = Field(default=None, description="Optional TLS certificate for the HTTP server.")
    tls_key_file: Path | None = Field(default=None, description="Optional TLS private key for the HTTP server.")
    ingest_max_body_bytes: int = Field(default=1_048_576, ge=1, description="Largest accepted ingest body, bytes.")
    ingest_max_skew_seconds: float = Field(default=3600.0, gt=0, description="Reject foreground reports further than this from now, seconds.")
    ingest_rate_per_second: float = Field(default=50.0, gt=0, description="Per-client token-bucket refill rate, requests/s.")
    ingest_burst: int = Field(default=100, ge=1, description="Per-client token-bucket size, requests.")

    # Leader election (coordination.k8s.io Lease)
    # An adversarial trial: an empty or upper-case name started, never led and never exited
    # (``/readyz`` 503 for ever); the API server takes only these (RFC 1123 subdomain / label).
    lease_name: str = Field(
        default="modelbackfill-controller",
        description="Name of the leader-election Lease (an RFC 1123 subdomain: lower case, digits, '-', '.'; at most 253).",
    )
    lease_namespace: str = Field(
        default="flexinfer-system",
        description="Namespace of the leader-election Lease (an RFC 1123 label).",
    )
    lease_duration_seconds: float = Field(default=15.0, gt=0, description="Lease duration, seconds (at least 3 times the renew period).")
    lease_renew_seconds: float = Field(
        default=5.0, ge=0.1, description="How often the leader renews, seconds (at least 0.1: ten Lease writes a second)."
    )
    identity: str | None = Field(default=None, description="Leader-election identity; unset: hostname + pid.")
    leader_elect: bool = Field(
        default=False,
        description="Take part in leader election on the Lease (on in the Deployment). Off: this process "
        "acts alone, as controller-runtime's --leader-elect defaults.",
    )

    # Timing
    resync_seconds: float = Field(default=60.0, gt=0, description="Safety-net re-check of every ModelBackfill, seconds.")
    watch_timeout_seconds: int = Field(default=60, gt=0, description="Server-side watch timeout, seconds; the watch is restarted after it.")
    watch_stale_margin_seconds: float = Field(
        default=10.0, gt=0,
        description="A watch that delivers nothing (no event, no bookmark) for watch_timeout_seconds plus this is "
        "presumed dead: the client-side read timeout restarts it by a relist, and /readyz reports it stale, seconds.",
    )
    api_qps: float = Field(
        default=200.0, gt=0,
        description="Client-side rate of the controller's Job creates, and separately of its status writes, calls/s "
        "(client-go's QPS; Job deletes are never held back).",
    )
    api_burst: int = Field(default=400, ge=1, description="Calls that may go at once before api_qps applies (client-go's burst).")
    api_timeout_seconds: float = Field(default=10.0, gt=0, description="Client-side timeout of every Kubernetes API call (and a watch's connect), seconds.")
    delete_timeout_seconds: float = Field(
        default=2.0, gt=0,
        description="Client-side timeout of a Job DELETE (the cancel path), seconds; one that times out is sent again at "
        "once on a fresh connection (a dead pooled connection must not hold a cancel for api_timeout_seconds).",
    )
    spool_max_records: int = Field(
        default=100_000, ge=10_000,
        description="Most observed events held in memory while the event log does not accept them; past it new "
        "observations are dropped (counted) and every watcher relists once the store is back. At least 10000: a "
        "relist hands every listed object to the spool at once, so one relist of every watched kind (Models, "
        "ModelBackfills, backfill Jobs, CronJobs, GamingSessions, GPULeases) must fit, or every relist drops "
        "observations again; relists that keep overflowing it are paced like a failed watch (backoff_initial_seconds "
        "doubling up to backoff_max_seconds).",
    )
    spool_max_bytes: int = Field(
        default=64 << 20, ge=1 << 20,
        description="Most payload bytes (the events' JSON) of the observations held in memory while the event log does "
        "not accept them; past it new observations are dropped as past spool_max_records. At least 1 MiB; the "
        "objects holding them take about twice as much memory (the Deployment's limit is 512 MiB).",
    )
    store_stall_seconds: float = Field(
        default=3.0, gt=0,
        description="/readyz reports the store when a read or an append has waited this long for an answer, seconds "
        "(a paused or hung server never answers; its own statement timeout cannot fire).",
    )
    health_stale_seconds: float = Field(
        default=120.0, gt=0,
        description="/healthz fails when the reconcile loop or the preemptor has not completed a pass for this long, seconds.",
    )
    backoff_initial_seconds: float = Field(default=0.5, gt=0, description="First reconnect back-off of a failed watch, seconds.")
    backoff_max_seconds: float = Field(default=30.0, gt=0, description="Largest reconnect back-off, seconds.")
    foreground_signal_granularity_seconds: float = Field(
        default=60.0,
        ge=0,
        description="How late Model.status.lastActiveTime may be (the proxy writes it about once a minute), seconds; "
        "added to the start of an idle window that comes from lastActiveTime (not from ingest reports). 0: none.",
    )
    poll_fallback_seconds: float = Field(default=1.0, gt=0, description="Event-log polling when no NOTIFY arrives, seconds.")

    # Database sessions (applied by backfill.store.make_engine to every pooled connection; 0
    # turns one of the three server-side timeouts off; the connect timeout is at least 1 s). A
    # paused or partitioned replica cannot hold the log's write lock for longer than the
    # idle-in-transaction timeout, and no call waits on a lock forever.
    db_lock_timeout_seconds: float = Field(default=2.0, ge=0, le=PG_MAX_TIMEOUT_SECONDS, description="PostgreSQL lock_timeout: longest wait for any lock (the log's write lock included), seconds; 0 is off, a positive value below 1 ms is 1 ms; at most 2147483.647 (PostgreSQL's limit, 2^31-1 ms).")
    db_statement_timeout_seconds: float = Field(default=10.0, ge=0, le=PG_MAX_TIMEOUT_SECONDS, description="PostgreSQL statement_timeout: longest single statement, seconds; 0 is off, a positive value below 1 ms is 1 ms; at most 2147483.647 (PostgreSQL's limit, 2^31-1 ms).")
    db_idle_in_transaction_timeout_seconds: float = Field(default=10.0, ge=0, le=PG_MAX_TIMEOUT_SECONDS, description="PostgreSQL idle_in_transaction_session_timeout: a session idle inside a transaction longer than this is ended by the server (its locks released), seconds; 0 is off, a positive value below 1 ms is 1 ms; at most 2147483.647 (PostgreSQL's limit, 2^31-1 ms).")
    db_connect_timeout_seconds: int = Field(default=10, ge=1, le=1_000_000_000, description="libpq connect_timeout: longest wait to open a connection, whole seconds; at least 1 (libpq waits for ever at 0, and at least 2 s).")

    # Storage
    event_partition_size: int = Field(
        default=1_000_000, ge=1000, le=1_000_000_000,
        description="Positions per partition of the events table (the unit backfill db prune drops); at most 1,000,000,000 "
        "(an adversarial trial: 9e18 made a partition that never fills, so nothing after it could ever be pruned, and 1e20 "
        "overflowed its bound).",
    )
    snapshot_every_events: int = Field(
        default=100_000, ge=1,
        description="The leader snapshots the projection after this many new events (start-up loads the newest "
        "snapshot and folds only the tail).",
    )
    snapshot_every_seconds: float = Field(
        default=900.0, gt=0, description="... or after this many seconds when anything new was folded, seconds."
    )
    snapshot_keep: int = Field(default=3, ge=1, description="Snapshots kept per projection of the running code version (plus the newest of every other version, for a rollback); older ones are deleted when a new one is saved.")

    @model_validator(mode="after")
    def _database_url_from_file(self) -> "Settings":
        """database_url unset and database_url_file set: read the URL from the file.

        Raises SettingsCheckError (a one-line settings error naming database_url_file) when the
        file is unreadable, empty, over 64 KiB (``/dev/zero`` is not read for ever) or not UTF-8
        (an adversarial trial: that one's error did not name the setting).
        """
        if self.database_url is None and self.database_url_file is not None:
            try:
                with open(self.database_url_file, "rb") as f:
                    raw = f.read(_URL_FILE_MAX + 1)
            except OSError as exc:
                raise SettingsCheckError(("database_url_file",), f"{self.database_url_file}: {exc.strerror or exc}") from None
            if len(raw) > _URL_FILE_MAX:
                raise SettingsCheckError(("database_url_file",), f"{self.database_url_file} is over 64 KiB: not a database URL")
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                raise SettingsCheckError(("database_url_file",), f"{self.database_url_file}: not UTF-8 text ({exc.reason} at byte {exc.start + 1})") from None
            if not text:
                raise SettingsCheckError(("database_url_file",), f"{self.database_url_file} is empty")
            self.database_url = text
        return self

    @field_validator("*")
    @classmethod
    def _seconds_bounded(cls, v: object, info: ValidationInfo) -> object:
        """A ``*_seconds`` setting is at most :data:`MAX_SECONDS`; ValueError otherwise."""
        if info.field_name and info.field_name.endswith("_seconds") and isinstance(v, (int, float)) and v > MAX_SECONDS:
            raise ValueError(f"at most {MAX_SECONDS} seconds (about 31 years)")
        return v

    @field_validator("namespace", "lease_namespace")
    @classmethod
    def _rfc1123_label(cls, v: str | None) -> str | None:
        """A namespace name (an RFC 1123 label, as the API server requires); ValueError in words
        otherwise (a trial read a raw regular expression)."""
        if v is not None and not _RFC1123_LABEL.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a namespace name: at most 63 lower-case letters, digits and '-', beginning and ending with a letter or digit"
            )
        return v

    @field_validator("lease_name")
    @classmethod
    def _rfc1123_subdomain(cls, v: str) -> str:
        """A Lease name (an RFC 1123 subdomain, as the API server requires); ValueError in words
        otherwise: an empty or upper-case name started, never led and never exited (a trial)."""
        if len(v) > 253 or not _RFC1123_SUBDOMAIN.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a Lease name: at most 253 lower-case letters, digits, '-' and '.', each '.'-separated part "
                "beginning and ending with a letter or digit"
            )
        return v

    @field_validator("metrics_address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        """``host:port`` with a port 0-65535 (0: any free port); ValueError otherwise."""
        host, sep, port = v.rpartition(":")
        if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
            raise ValueError(f"{v!r} is not host:port with a port from 0 to 65535")
        return v

    @model_validator(mode="after")
    def _lease_timing(self) -> "Settings":
        """``lease_duration_seconds`` >= 3 x ``lease_renew_seconds``; SettingsCheckError naming
        both otherwise. The leader acts until ``duration - renew`` after the start of its last
        renew and renews every ``renew`` seconds (one round: at most two calls of at most
        ``renew / 2`` each), so a shorter lease lapses between renews: leadership flaps, and
        before this check (``duration`` 1, ``renew`` 5: a new users' trial) two replicas led at
        once (:mod:`backfill.controller.leader`)."""
        three = 3 * self.lease_renew_seconds  # 3 x 0.1 is 0.30000000000000004: 0.3 is 3 times 0.1
        if self.lease_duration_seconds < three and not math.isclose(self.lease_duration_seconds, three):
            raise SettingsCheckError(
                ("lease_duration_seconds", "lease_renew_seconds"),
                f"the lease duration ({self.lease_duration_seconds:g} s) must be at least 3 times the renew period "
                f"({self.lease_renew_seconds:g} s): the leader stops acting at duration - renew after its last renew",
            )
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> "Settings":
        """Both TLS files or neither; SettingsCheckError naming both otherwise."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise SettingsCheckError(("tls_cert_file", "tls_key_file"), "must be set together (both or neither)")
        return self
