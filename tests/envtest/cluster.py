"""A real kube-apiserver + etcd on loopback ports, for tests (no Docker, no controller-manager).

    from tests.envtest.cluster import LocalCluster, ensure_binaries

    ensure_binaries()                      # builds them with build.sh on a fresh clone (~5 min)
    with LocalCluster() as cluster:        # start() ... stop()
        cluster.apply_crds(["deploy/crds/modelbackfills.ai.flexinfer.yaml"])
        api = cluster.api_client()         # a configured kubernetes.client.ApiClient

Everything lives in a temp dir (certificates, keys, token file, kubeconfig, etcd data, and the
logs ``etcd.log`` / ``kube-apiserver.log``) that ``stop()`` removes; set
``BACKFILL_ENVTEST_KEEP=1`` to keep it for debugging. ``BACKFILL_ENVTEST_BIN`` points at another
folder holding ``kube-apiserver`` and ``etcd`` (default: ``tests/envtest/bin``).

There is no controller-manager: no garbage collector, no Job controller, no pods, no namespace
finalization. The identity behind ``token`` is in ``system:masters``.

Fault injection (tests/faults):

    cluster = LocalCluster(audit_policy=WRITES_AUDIT_POLICY, users=["replica-a", "replica-b"])
    cluster.kubeconfig_for("replica-a")    # a kubeconfig authenticating as that user
    cluster.pause(); cluster.resume()      # SIGSTOP / SIGCONT the kube-apiserver process
    cluster.audit_events(user="replica-a", verb="delete", resource="jobs")

Each extra user has its own bearer token (``--token-auth-file``) and is in ``system:masters``,
so the audit log (``audit.log`` in the temp dir, one JSON object per line) tells them apart.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENVTEST_DIR = Path(__file__).resolve().parent
BUILD_SCRIPT = ENVTEST_DIR / "build.sh"
BIN_ENV = "BACKFILL_ENVTEST_BIN"
KEEP_ENV = "BACKFILL_ENVTEST_KEEP"

# Named timeouts (seconds).
ETCD_READY_TIMEOUT = 30.0
APISERVER_READY_TIMEOUT = 90.0
CRD_READY_TIMEOUT = 60.0
BUILD_TIMEOUT = 40 * 60.0
STOP_TIMEOUT = 10.0
# Creates of a custom resource sleep 2 s while its CRD was Established < 2 s ago (server-side).
CRD_CREATE_DELAY_WINDOW = 2.05


class EnvtestError(RuntimeError):
    """The local cluster could not be built, started or configured."""


def bin_dir() -> Path:
    return Path(os.environ.get(BIN_ENV) or ENVTEST_DIR / "bin").resolve()


def _binaries(directory: Path) -> tuple[Path, Path]:
    return directory / "kube-apiserver", directory / "etcd"


def _present(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def ensure_binaries(timeout: float = BUILD_TIMEOUT) -> tuple[Path, Path]:
    """Return (kube-apiserver, etcd); run build.sh first when either is missing.

    Raises EnvtestError (with the end of build.sh's output) when the build fails.
    """
    directory = bin_dir()
    apiserver, etcd = _binaries(directory)
    if _present(apiserver) and _present(etcd):
        return apiserver, etcd
    print(
        f"envtest: kube-apiserver/etcd missing in {directory}; running {BUILD_SCRIPT} "
        "(a cold build takes ~5 min on 2 cores)",
        file=sys.stderr,
        flush=True,
    )
    env = dict(os.environ, **{BIN_ENV: str(directory)})
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise EnvtestError(f"{BUILD_SCRIPT} did not finish within {timeout:.0f} s") from exc
    if proc.returncode != 0 or not (_present(apiserver) and _present(etcd)):
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise EnvtestError(
            f"{BUILD_SCRIPT} failed (exit {proc.returncode}); "
            f"kube-apiserver/etcd are not in {directory}. Last output:\n{tail}"
        )
    return apiserver, etcd


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGTERM the child when the process that started it dies (e.g. a killed pytest).

    Note: the "parent" is the starting *thread*; start the cluster from a long-lived thread.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except Exception:
        pass


# --------------------------------------------------------------------------- certificates


def _write_pki(directory: Path) -> dict[str, Path]:
    """A test CA, a serving cert for localhost/127.0.0.1, and an RSA service-account key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=7)

    def pem_key(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "backfill-envtest-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = {
        "ca_cert": directory / "ca.crt",
        "serving_cert": directory / "apiserver.crt",
        "serving_key": directory / "apiserver.key",
        "sa_key": directory / "sa.key",
        "sa_pub": directory / "sa.pub",
    }
    paths["ca_cert"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_cert"].write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_key"].write_bytes(pem_key(serving_key))
    paths["sa_key"].write_bytes(pem_key(sa_key))
    paths["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key in ("serving_key", "sa_key"):
        paths[key].chmod(0o600)
    return paths


# --------------------------------------------------------------------------- the cluster


#: An audit policy recording every mutating request (no request/response bodies) and nothing
#: else: enough to count Job creates/deletes, status writes and Events per user.
WRITES_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: None
"""


class LocalCluster:
    """etcd + kube-apiserver on free loopback ports, with a bearer token in system:masters.

    Args:
        binaries: (kube-apiserver, etcd); default: those in :func:`bin_dir`.
        extra_apiserver_args: appended to the kube-apiserver command line.
        audit_policy: an ``audit.k8s.io/v1`` Policy (YAML text); when set the apiserver writes
            its audit log as JSON lines to ``<workdir>/audit.log`` (blocking mode, so an event is
            on disk before the response is sent). Read it with :meth:`audit_events`.
        users: extra identities, each with its own bearer token, all in ``system:masters``
            (:attr:`user_tokens`, :meth:`kubeconfig_for`).
    """

    def __init__(
        self,
        binaries: tuple[Path, Path] | None = None,
        extra_apiserver_args: Iterable[str] = (),
        *,
        audit_policy: str | None = None,
        users: Iterable[str] = (),
    ) -> None:
        self.apiserver_bin, self.etcd_bin = binaries or _binaries(bin_dir())
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.audit_policy = audit_policy
        self.users = list(users)
        self.user_tokens: dict[str, str] = {}
        self.audit_log: Path | None = None
        self.workdir: Path | None = None
        self.token: str = ""
        self.host: str = ""  # https://127.0.0.1:PORT
        self.ca_file: str = ""
        self.kubeconfig_path: str = ""
        self.etcd_url: str = ""
        self.etcd_log: Path | None = None
        self.apiserver_log: Path | None = None
        self.startup_seconds: float | None = None  # kube-apiserver launch -> /readyz ok
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._ssl: ssl.SSLContext | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalCluster:
        if self._apiserver is not None:
            return self
        for b in (self.apiserver_bin, self.etcd_bin):
            if not _present(Path(b)):
                raise EnvtestError(f"{b} is missing: run tests/envtest/build.sh (or ensure_binaries())")
        self.workdir = Path(tempfile.mkdtemp(prefix="backfill-envtest-"))
        try:
            self._prepare_files()
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate kube-apiserver then etcd, and remove the temp dir (unless BACKFILL_ENVTEST_KEEP)."""
        for attr in ("_apiserver", "_etcd"):
            proc = getattr(self, attr)
            setattr(self, attr, None)
            if proc is None or proc.poll() is not None:
                continue
            os.kill(proc.pid, signal.SIGCONT)  # a paused process would never act on SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT)
        if self.workdir is not None:
            if os.environ.get(KEEP_ENV):
                print(f"envtest: kept {self.workdir}", file=sys.stderr)
            else:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # -- faults ------------------------------------------------------------------------------

    def pause(self) -> None:
        """SIGSTOP the kube-apiserver: connections stay open and go silent (no RST, no answer)."""
        assert self._apiserver is not None and self._apiserver.poll() is None, "kube-apiserver not running"
        os.kill(self._apiserver.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the kube-apiserver after :meth:`pause`."""
        assert self._apiserver is not None, "kube-apiserver not started"
        os.kill(self._apiserver.pid, signal.SIGCONT)

    def restart_apiserver(self) -> float:
        """Stop the kube-apiserver (SIGTERM) and start it again on the same port, with the same
        etcd (data kept); returns the seconds it was unreachable. Every open watch ends."""
        assert self._apiserver is not None, "kube-apiserver not started"
        t0 = time.monotonic()
        proc, self._apiserver = self._apiserver, None
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
        self._start_apiserver(port=int(self.host.rsplit(":", 1)[1]))
        return time.monotonic() - t0

    def kubeconfig_for(self, user: str, server: str | None = None) -> str:
        """Path of a kubeconfig authenticating as ``user`` (one of ``users``), talking to
        ``server`` (default: the apiserver itself; e.g. a proxy in front of it)."""
        assert self.workdir is not None, "cluster not started"
        token = self.user_tokens[user]
        suffix = "" if server is None else "-" + server.rsplit(":", 1)[-1]
        path = self.workdir / f"kubeconfig-{user}{suffix}"
        self._write_kubeconfig(path, user, token, server)
        return str(path)

    def audit_events(
        self,
        *,
        user: str | None = None,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = "",
        namespace: str | None = None,
        stage: str = "ResponseComplete",
    ) -> list[dict[str, Any]]:
        """The audit log's events (decoded JSON lines) matching every given filter.

        ``subresource=""`` (the default) keeps only requests on the object itself, ``None``
        any subresource, ``"status"`` only status writes. Raises EnvtestError without an
        audit policy.
        """
        if self.audit_log is None:
            raise EnvtestError("this cluster was started without an audit_policy")
        out: list[dict[str, Any]] = []
        try:
            lines = self.audit_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line being written
            ref = e.get("objectRef") or {}
            if stage and e.get("stage") != stage:
                continue
            if user is not None and (e.get("user") or {}).get("username") != user:
                continue
            if verb is not None and e.get("verb") != verb:
                continue
            if resource is not None and ref.get("resource") != resource:
                continue
            if subresource is not None and (ref.get("subresource") or "") != subresource:
                continue
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            out.append(e)
        return out

    @property
    def running(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self._etcd, self._apiserver))

    # -- clients -----------------------------------------------------------------------------

    def configuration(self) -> Any:
        from kubernetes import client

        cfg = client.Configuration(
            host=self.host,
            api_key={"BearerToken": self.token},
            api_key_prefix={"BearerToken": "Bearer"},
            ssl_ca_cert=self.ca_file,
        )
        return cfg

    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient for this cluster (close it when done)."""
        from kubernetes import client

        return client.ApiClient(self.configuration())

    def get_json(self, path: str, timeout: float = 10.0, accept: str = "application/json") -> Any:
        """GET a path on the apiserver with the admin token; returns the decoded JSON."""
        status, body = self._get(path, timeout, accept)
        if status != 200:
            raise EnvtestError(f"GET {path}: HTTP {status}: {body[:500]}")
        return json.loads(body)

    # -- CRDs --------------------------------------------------------------------------------

    def apply_crds(
        self,
        paths: Iterable[str | os.PathLike[str]],
        timeout: float = CRD_READY_TIMEOUT,
        settle: bool = True,
    ) -> list[str]:
        """Create (or replace) the CRDs in the given YAML files; wait until each is Established,
        its resource is listed by discovery and a LIST of it succeeds. Returns the CRD names.

        settle: the apiserver delays every *create* of a custom resource by 2 s while its CRD
        became Established less than 2 s ago (customresource_handler.go, "justCreated"); wait
        that window out here so that tests and benchmarks see steady-state latencies.
        """
        import yaml
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        docs: list[dict[str, Any]] = []
        for path in paths:
            for doc in yaml.safe_load_all(Path(path).read_text()):
                if not doc:
                    continue
                if doc.get("kind") != "CustomResourceDefinition":
                    raise EnvtestError(f"{path}: not a CustomResourceDefinition: kind={doc.get('kind')!r}")
                docs.append(doc)

        names: list[str] = []
        with self.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for doc in docs:
                name = doc["metadata"]["name"]
                names.append(name)
                try:
                    ext.create_custom_resource_definition(body=doc)
                except ApiException as exc:
                    if exc.status != 409:
                        raise EnvtestError(f"creating CRD {name}: HTTP {exc.status}: {exc.body}") from exc
                    current = ext.read_custom_resource_definition(name)
                    doc = dict(doc, metadata=dict(doc["metadata"], resourceVersion=current.metadata.resource_version))
                    ext.replace_custom_resource_definition(name, body=doc)

            deadline = time.monotonic() + timeout
            established_at = [self._wait_crd_established(ext, doc, deadline) for doc in docs]
        if settle and established_at:
            remaining = max(established_at) + CRD_CREATE_DELAY_WINDOW - time.time()
            if remaining > 0:
                time.sleep(remaining)
        return names

    def _wait_crd_established(self, ext: Any, doc: dict[str, Any], deadline: float) -> float:
        """Wait until the CRD is usable; returns its Established lastTransitionTime (epoch s)."""
        name = doc["metadata"]["name"]
        group, plural = doc["spec"]["group"], doc["spec"]["names"]["plural"]
        versions = [v["name"] for v in doc["spec"]["versions"] if v.get("served", True)]
        last = "not read yet"
        while True:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c for c in (crd.status.conditions or [])} if crd.status else {}
            est, acc = conds.get("Established"), conds.get("NamesAccepted")
            if acc is not None and acc.status == "False":
                raise EnvtestError(f"CRD {name}: names not accepted: {acc.reason}: {acc.message}")
            if est is not None and est.status == "True":
                missing = [v for v in versions if not self._served(group, v, plural)]
                if missing:
                    last = f"Established, but discovery does not list {plural} in {group}/{missing}"
                else:
                    # Right after establishment a LIST can answer 429 "storage is (re)initializing"
                    # until the watch cache is ready: wait for a successful one.
                    status, body = self._get(f"/apis/{group}/{versions[0]}/{plural}?limit=1", 5.0)
                    if status == 200:
                        return est.last_transition_time.timestamp() if est.last_transition_time else time.time()
                    last = f"served, but LIST answers HTTP {status}: {body[:200]}"
            else:
                last = f"conditions {[(c.type, c.status, c.reason) for c in conds.values()]}"
            if time.monotonic() > deadline:
                raise EnvtestError(f"CRD {name} not ready in time: {last}")
            time.sleep(0.05)

    def _served(self, group: str, version: str, plural: str) -> bool:
        status, body = self._get(f"/apis/{group}/{version}", 5.0)
        if status != 200:
            return False
        return any(r.get("name") == plural for r in json.loads(body).get("resources", []))

    # -- internals ---------------------------------------------------------------------------

    def _prepare_files(self) -> None:
        assert self.workdir is not None
        pki = _write_pki(self.workdir)
        self._pki = pki
        self.ca_file = str(pki["ca_cert"])
        self.token = secrets.token_urlsafe(32)
        tokens = self.workdir / "tokens.csv"
        lines = [f'{self.token},admin,admin-uid,"system:masters"']
        for i, user in enumerate(self.users):
            self.user_tokens[user] = secrets.token_urlsafe(32)
            lines.append(f'{self.user_tokens[user]},{user},{user}-uid-{i},"system:masters"')
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        self._tokens = tokens
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self.etcd_log = self.workdir / "etcd.log"
        self.apiserver_log = self.workdir / "kube-apiserver.log"

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )

    def _start_etcd(self) -> None:
        assert self.workdir is not None and self.etcd_log is not None
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._etcd = self._spawn(
            [
                str(self.etcd_bin),
                "--name=envtest",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=envtest={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            self.etcd_log,
        )
        deadline = time.monotonic() + ETCD_READY_TIMEOUT
        last = ""
        while True:
            if self._etcd.poll() is not None:
                raise EnvtestError(
                    f"etcd exited with code {self._etcd.returncode}; last log lines:\n{_tail(self.etcd_log)}"
                )
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                    body = resp.read().decode()
                if json.loads(body).get("health") == "true":
                    return
                last = body
            except (OSError, ValueError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise EnvtestError(
                    f"etcd not healthy after {ETCD_READY_TIMEOUT:.0f} s ({last}); "
                    f"last log lines:\n{_tail(self.etcd_log)}"
                )
            time.sleep(0.05)

    def _start_apiserver(self, port: int | None = None) -> None:
        assert self.workdir is not None and self.apiserver_log is not None
        port = port or free_port()
        self.host = f"https://127.0.0.1:{port}"
        pki = self._pki
        args = [
            str(self.apiserver_bin),
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki['serving_cert']}",
            f"--tls-private-key-file={pki['serving_key']}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://localhost",
            f"--service-account-key-file={pki['sa_pub']}",
            f"--service-account-signing-key-file={pki['sa_key']}",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            f"--token-auth-file={self._tokens}",
            *self._audit_args(),
            *self.extra_apiserver_args,
        ]
        started = time.monotonic()
        self._apiserver = self._spawn(args, self.apiserver_log)
        deadline = started + APISERVER_READY_TIMEOUT
        last = ""
        while True:
            if self._apiserver.poll() is not None:
                raise EnvtestError(
                    f"kube-apiserver exited with code {self._apiserver.returncode}; "
                    f"last log lines:\n{_tail(self.apiserver_log)}"
                )
            status, body = self._get("/readyz", 2.0)
            if status == 200:
                break
            last = f"HTTP {status}: {body[-300:]}" if status else body
            if time.monotonic() > deadline:
                raise EnvtestError(
                    f"kube-apiserver /readyz not ok after {APISERVER_READY_TIMEOUT:.0f} s ({last}); "
                    f"last log lines:\n{_tail(self.apiserver_log)}"
                )
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - started
        self._write_kubeconfig()

    def _audit_args(self) -> list[str]:
        if self.audit_policy is None:
            return []
        assert self.workdir is not None
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(self.audit_policy)
        self.audit_log = self.workdir / "audit.log"
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--audit-log-maxsize=0",
        ]

    def _get(self, path: str, timeout: float, accept: str = "application/json") -> tuple[int, str]:
        """(status, body) of a GET with the admin token; (0, error text) when not connected."""
        req = urllib.request.Request(
            self.host + path, headers={"Authorization": f"Bearer {self.token}", "Accept": accept}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as exc:
            return 0, str(exc)

    def _write_kubeconfig(
        self, path: Path | None = None, user: str = "admin", token: str | None = None, server: str | None = None
    ) -> None:
        import yaml

        assert self.workdir is not None
        token = token if token is not None else self.token
        ca_data = base64.b64encode(Path(self.ca_file).read_bytes()).decode()
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "envtest", "cluster": {"server": server or self.host, "certificate-authority-data": ca_data}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
            "current-context": "envtest",
        }
        default = path is None
        path = path if path is not None else self.workdir / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        path.chmod(0o600)
        if default:
            self.kubeconfig_path = str(path)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m tests.envtest.cluster --kubeconfig PATH``: start the kube-apiserver + etcd the
    tests use (built by ``tests/envtest/build.sh``), write an admin kubeconfig to ``PATH`` and
    serve until interrupted (Ctrl-C or SIGTERM), then stop both. For trying the controller
    without kind or minikube; nothing is applied (the README's try-out does that)."""
    import argparse
    import threading

    ap = argparse.ArgumentParser(prog="python -m tests.envtest.cluster", description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", type=Path, required=True, help="where to write the admin kubeconfig")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if not args.kubeconfig.parent.is_dir():
        ap.error(f"--kubeconfig: directory {args.kubeconfig.parent} does not exist")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        cluster = LocalCluster().start()
    except EnvtestError as exc:
        print(f"envtest: error: {exc}", file=sys.stderr)
        return 2
    try:
        cluster._write_kubeconfig(args.kubeconfig.resolve())
        print(f"envtest: kube-apiserver at {cluster.host}; kubeconfig {args.kubeconfig} (Ctrl-C stops it)", flush=True)
        while not stop.wait(1.0) and cluster.running:
            pass
        if not cluster.running:
            print(f"envtest: error: kube-apiserver or etcd exited; see {cluster.apiserver_log}", file=sys.stderr)
            return 1
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
