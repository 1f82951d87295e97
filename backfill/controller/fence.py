"""Fencing at the last moment: no mutating request leaves this process unless it leads right then.

Every component checks leadership before it acts, but a check and the request it guards are
separate steps: a replica stopped between them (SIGSTOP, a long GC pause, a frozen VM) and resumed
after its Lease expired would still send the request. The Job API has no fencing token, so the
narrowest place to close that window is the HTTP client itself: :func:`fence` wraps the
ApiClient's REST layer so that a POST, PUT, PATCH or DELETE is refused with
:class:`~backfill.controller.actor.NotLeader` unless ``can_act()`` holds at the moment of sending
(after serialisation and connection-pool waits, which the earlier checks could not cover). Lease
requests (leader election itself) pass. A window of a few microseconds remains between this check
and the socket write.
"""

from __future__ import annotations

from typing import Any, Callable

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def fence(api: Any, can_act: Callable[[], bool]) -> None:
    """Make ``api`` (a kubernetes ApiClient) refuse mutating requests while ``can_act()`` is false.

    Raises (from the wrapped requests): NotLeader."""
    from .actor import NotLeader

    rest = api.rest_client
    send = rest.request
    if getattr(send, "_fenced", False):
        return

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in MUTATING and "/leases/" not in url and not url.endswith("/leases") and not can_act():
            raise NotLeader(f"{method} {url.split('?', 1)[0]}: this replica does not hold the Lease")
        return send(method, url, *args, **kwargs)

    request._fenced = True  # type: ignore[attr-defined]
    rest.request = request
