"""An error as one line of a log message or status: the one rule every module uses.

A Kubernetes API error (``kubernetes.client.ApiException`` and its subclasses, such as
``UnprocessableEntityException``) says only ``(422)`` on its first line: its reason and the API
server's own message (which names the field a 422 refuses, the user and verb a 403 denies) are in
its ``metav1.Status`` body. An adversarial trial read ``ReleaseFinalizer failed:
UnprocessableEntityException: (422)`` and had to repeat the call by hand to learn why.
:func:`error_line` gives ``UnprocessableEntityException: (422) Unprocessable Entity: <message>``;
any other error its class and the first line of its message.

Pure: no I/O, no import of the Kubernetes client (an API error is recognised by its ``status``
and ``body`` attributes).
"""

from __future__ import annotations

import json

__all__ = ["MAX_MESSAGE", "api_status", "error_line", "message_line"]

#: Characters of an error's message kept in one line (an API server's list of field errors can
#: run to kilobytes).
MAX_MESSAGE = 1000


def api_status(exc: BaseException) -> tuple[str, str]:
    """``(reason, message)`` of a Kubernetes API error: from its ``metav1.Status`` body when it
    has one (``reason`` e.g. ``Invalid``, ``message`` the API server's), else its HTTP reason
    and raw body; both stripped, either may be empty. Never raises."""
    raw = getattr(exc, "body", None)
    if isinstance(raw, (bytes, bytearray)):
        raw = raw.decode("utf-8", "replace")
    try:
        body = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    http_reason = getattr(exc, "reason", None) or ""
    reason = str(body.get("reason") or http_reason)
    message = str(body.get("message") or (raw if isinstance(raw, str) else "") or http_reason)
    return reason.strip(), message.strip()


def message_line(exc: BaseException) -> str:
    """What ``exc`` says, in one line without its class: ``(status) HTTP reason: API server
    message`` for a Kubernetes API error (an exception with an integer ``status`` and a
    ``body``; the whole message, its lines joined), else the first line of its message; cut at
    :data:`MAX_MESSAGE` characters (ending ``...``); empty when it says nothing. Never raises."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "body"):
        _, message = api_status(exc)
        message = " ".join(line.strip() for line in message.splitlines() if line.strip())
        http_reason = str(getattr(exc, "reason", None) or "").strip()
        head = f"({status}) {http_reason}".rstrip()
        text = f"{head}: {message}" if message and message != http_reason else head
    else:
        try:
            lines = str(exc).strip().splitlines()
        except Exception:  # noqa: BLE001 - a broken __str__ must not lose the error
            lines = []
        text = lines[0].strip() if lines else ""  # the first line: what went wrong, not a dump
    return text[: MAX_MESSAGE - 3] + "..." if len(text) > MAX_MESSAGE else text


def error_line(exc: BaseException) -> str:
    """``exc`` as one line: ``Class: `` and :func:`message_line`, e.g.
    ``UnprocessableEntityException: (422) Unprocessable Entity: Job.batch "x" is invalid: ...``
    or ``ConnectionError: [Errno 111] Connection refused``; the class alone when the error
    says nothing. Never raises."""
    text = message_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
