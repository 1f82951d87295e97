"""A chaos soak's finding (helper-30): stopping must be fail-safe with two faults at once.

PostgreSQL stopped, then the leader cut off from the API server (a partition: its connections
go silent). A router's report reached the leader, which answered ``202 {"spooled": 1}``: its
cancel hung in the partition, the report was durable nowhere, and the router (answered) did not
retry. The standby took the Lease over about a lease later, knew nothing of the report, and the
Job ran until the store came back (31 s; however long the store stays away).

Now the leader answers ``503 cancel_unanswered`` with ``Retry-After`` while its cancel call is
unanswered and the log has not taken the report; the router retries through the Service (here:
alternately to both replicas) until a replica that can act takes it. Asserted on the cluster
(the Job) and the audit log (who deleted it), with PostgreSQL still stopped.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from .harness import FAST_SETTINGS, JobPlayer, Kube
from .test_leader_faults import holder, leader_and_standby
from .workload import CANCEL_BOUND_SECONDS, declare, start_running

pytestmark = pytest.mark.kube

LEASE = float(FAST_SETTINGS["BACKFILL_LEASE_DURATION_SECONDS"])
TOKEN = "t0ken"


def _report(proc, ns: str, model: str, at: str) -> tuple[int, dict, str | None]:
    body = json.dumps({"reports": [{"namespace": ns, "model": model, "time": at, "count": 1, "id": "router/1"}]}).encode()
    req = urllib.request.Request(
        f"http://{proc.address}/v1/foreground", data=body, method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read()), None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers.get("Retry-After")
    except OSError as exc:  # the replica does not answer at all: the router tries the next
        return 0, {"error": str(exc)}, "1"


def test_a_report_to_a_leader_cut_off_with_the_store_down_is_retried_until_a_replica_acts(
    fault_cluster, kube: Kube, player: JobPlayer, controllers, proxy, tmp_path
):
    token = tmp_path / "ingest-token"
    token.write_text(TOKEN + "\n")
    pg = controllers.pg
    declare(kube, [("bf", "gemma")])
    a, b = leader_and_standby(kube, controllers, a_server=proxy.url, BACKFILL_INGEST_TOKEN_FILE=str(token))
    job = start_running(kube, player, "bf")
    pg.stop()
    try:
        proxy.partition()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.monotonic()
        answers: list[tuple[str, int, str]] = []
        gone = None
        replicas = [a, b]
        i = 0
        while time.monotonic() - t0 < LEASE + CANCEL_BOUND_SECONDS + 10:  # a router behind the Service
            status, body, retry_after = _report(replicas[i % 2], kube.ns, "gemma", at)
            answers.append((replicas[i % 2].identity, status, body.get("error", "")))
            if status == 202:
                break
            assert status in (0, 503) and retry_after == "1", (status, body)
            i += 1
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                if gone is None and kube.job(job) is None:
                    gone = time.monotonic() - t0
                time.sleep(0.05)
        first = answers[0]
        assert first[1:] == (503, "cancel_unanswered"), answers  # was 202: nobody retried, nobody acted
        while gone is None and time.monotonic() - t0 < LEASE + CANCEL_BOUND_SECONDS + 10:
            if kube.job(job) is None:
                gone = time.monotonic() - t0
            time.sleep(0.05)
        print(f"answers {answers}; Job gone {gone} s after the first report (lease {LEASE} s); holder {holder(kube)}")
        assert gone is not None and gone <= LEASE + CANCEL_BOUND_SECONDS, (gone, answers)  # PostgreSQL still stopped
    finally:
        proxy.heal()
        pg.start()
    deletes = [
        e["user"]["username"]
        for e in fault_cluster.audit_events(namespace=kube.ns, resource="jobs", subresource=None)
        if e["verb"] == "delete" and (e.get("objectRef") or {}).get("name") == job and e.get("responseStatus", {}).get("code") == 200
    ]
    assert deletes == ["replica-b"], deletes  # the standby that took the Lease over acted on the retried report
