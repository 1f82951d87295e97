"""An API error as one log line (``backfill.errorlines``), on real refusals of the API server.

An adversarial trial read ``ReleaseFinalizer failed: UnprocessableEntityException: (422)``: the
first line of the client's exception is its status alone, and the API server's message (the
field a 422 refuses) was lost. Each case here provokes the refusal from the real API server and
checks the line carries the server's own message.
"""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from backfill.errorlines import MAX_MESSAGE, error_line, message_line

pytestmark = pytest.mark.kube


def _refusal(call) -> ApiException:
    with pytest.raises(ApiException) as info:
        call()
    return info.value


def test_a_422_names_the_field_the_api_server_refuses(kube_api, kube_namespace):
    batch = client.BatchV1Api(kube_api)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "no-containers"},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": []}}}}
    exc = _refusal(lambda: batch.create_namespaced_job(kube_namespace, job, _request_timeout=5))
    assert exc.status == 422
    assert str(exc).splitlines()[0] == "(422)"  # all the old line said
    line = error_line(exc)
    assert line.startswith(f"{type(exc).__name__}: (422) Unprocessable Entity: "), line
    assert 'Job.batch "no-containers" is invalid' in line and "spec.template.spec.containers" in line, line
    assert "\n" not in line


def test_a_404_and_a_409_carry_the_api_servers_message(kube_api, kube_namespace):
    core = client.CoreV1Api(kube_api)
    exc = _refusal(lambda: core.read_namespaced_config_map("absent", kube_namespace, _request_timeout=5))
    assert error_line(exc) == f'{type(exc).__name__}: (404) Not Found: configmaps "absent" not found'
    body = {"metadata": {"name": "twice"}, "data": {"a": "b"}}
    core.create_namespaced_config_map(kube_namespace, body, _request_timeout=5)
    exc = _refusal(lambda: core.create_namespaced_config_map(kube_namespace, body, _request_timeout=5))
    assert message_line(exc) == '(409) Conflict: configmaps "twice" already exists'


def test_other_errors_are_their_class_and_first_line_cut_to_the_limit():
    assert error_line(ConnectionRefusedError(111, "Connection refused")) == "ConnectionRefusedError: [Errno 111] Connection refused"
    assert error_line(ValueError("first\nsecond")) == "ValueError: first"
    assert error_line(TimeoutError()) == "TimeoutError"
    long = error_line(RuntimeError("x" * 5000))
    assert long == "RuntimeError: " + "x" * (MAX_MESSAGE - 3) + "..."
    # an API error whose body is not a Status: the HTTP reason
    assert error_line(ApiException(status=503, reason="Service Unavailable")) == "ApiException: (503) Service Unavailable"
