"""The fence: a mutating request leaves the process only while this replica leads (Lease calls
always pass); reads are never fenced."""

from __future__ import annotations

import pytest

from backfill.controller.actor import NotLeader
from backfill.controller.fence import fence


class FakeRest:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def request(self, method, url, *args, **kwargs):
        self.sent.append((method, url))
        return "ok"


class FakeApi:
    def __init__(self) -> None:
        self.rest_client = FakeRest()


def test_mutations_need_the_lease_reads_and_lease_calls_do_not():
    api, leading = FakeApi(), {"now": False}
    rest = api.rest_client
    fence(api, lambda: leading["now"])
    fence(api, lambda: leading["now"])  # idempotent: wrapped once
    jobs = "https://h/apis/batch/v1/namespaces/ns/jobs"
    for method in ("POST", "PUT", "PATCH", "DELETE", "delete"):
        with pytest.raises(NotLeader):
            api.rest_client.request(method, f"{jobs}/j?propagationPolicy=Background")
    assert api.rest_client.request("GET", jobs) == "ok"
    assert api.rest_client.request("PUT", "https://h/apis/coordination.k8s.io/v1/namespaces/ns/leases/l") == "ok"
    assert api.rest_client.request("POST", "https://h/apis/coordination.k8s.io/v1/namespaces/ns/leases") == "ok"
    leading["now"] = True
    assert api.rest_client.request("DELETE", f"{jobs}/j") == "ok"
    assert [m for m, _ in rest.sent] == ["GET", "PUT", "POST", "DELETE"]
