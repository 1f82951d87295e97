"""Snapshots of the projection (the core's ``World``) and the replay loop over the log.

A snapshot is the projection folded up to a position, pickled, and stored with the checkpoint of
the same name in one transaction (:meth:`backfill.store.EventStore.save_snapshot`). It is tagged
with :func:`code_version`: ``backfill.core.state.STATE_VERSION`` plus a fingerprint of the shape
of everything a snapshot holds or a fold reads (the fields of every state class and of the spec,
every event type and its version). A snapshot of another version is never asked for, so a release
that changes the state refolds from the log once instead of misreading a state built by other
rules; a release that changes neither keeps reading the snapshots (so an upgrade after
``backfill db prune`` still starts). A change of a fold's meaning without a change of shape must
bump ``STATE_VERSION``. Start-up loads the newest snapshot of the running version and folds only
the tail; ``backfill replay --since T`` starts from the newest snapshot before ``T``.

The payload is a pickle: only the controller writes it, into its own schema, and only that schema's
readers load it (a reader of the log must trust its writer anyway).
"""

from __future__ import annotations

import hashlib
import pickle
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator

from backfill.core.audit import Auditor
from backfill.core.events import decode_rows
from backfill.core.state import World
from backfill.errorlines import error_line

#: Snapshot (and checkpoint) name of the controller's projection.
PROJECTION = "projection"


@lru_cache(maxsize=1)
def code_version() -> str:
    """``"<STATE_VERSION>-<12 hex>"``: the state version and a sha256 of the state's shape."""
    import dataclasses

    from backfill.core import events, spec, state

    parts = [f"state {state.STATE_VERSION}"]
    for module in (state, spec):
        for name in sorted(vars(module)):
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                if hasattr(obj, "__struct_fields__"):
                    parts.append(f"{name}{obj.__struct_fields__}")
                elif hasattr(obj, "_fields"):
                    parts.append(f"{name}{obj._fields}")
                elif dataclasses.is_dataclass(obj):
                    parts.append(f"{name}{tuple(f.name for f in dataclasses.fields(obj))}")
    for name, cls in sorted(events.EVENT_TYPES.items()):
        parts.append(f"{name} v{cls.version} {tuple(sorted(cls.model_fields))}")
    return f"{state.STATE_VERSION}-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def dump_world(world: World) -> bytes:
    """The snapshot payload of ``world``."""
    return pickle.dumps(world, protocol=pickle.HIGHEST_PROTOCOL)


def load_world(payload: bytes) -> World:
    """The World in a snapshot payload.

    Raises:
        ValueError: the payload is not a pickled World.
    """
    try:
        world = pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001 - any unpickling error: not a snapshot of ours
        raise ValueError(f"unreadable snapshot: {error_line(exc)}") from None
    if not isinstance(world, World):
        raise ValueError(f"a snapshot holds a {type(world).__name__}, not a World")
    return world


def _loaded(position: int, payload: bytes) -> World:
    """The World of the snapshot at ``position``.

    Raises:
        ValueError: unreadable, or folded up to another position.
    """
    world = load_world(payload)
    if world.position != position:
        raise ValueError(f"snapshot at position {position} holds a projection folded up to {world.position}")
    return world


def readable(position: int, payload: bytes) -> bool:
    """Whether this release can start from the snapshot at ``position`` (``backfill db prune``
    counts only such a snapshot as covering)."""
    try:
        _loaded(position, payload)
    except ValueError:
        return False
    return True


def latest(events: Any, before: int | None = None, unreadable: list[str] | None = None) -> World | None:
    """The snapshot of this code version to fold the log from, or None (fold from position 0).

    Without ``before``: the newest; with it: the newest at or before position ``before``
    (``replay --since``). On a pruned log (``events.pruned_up_to()`` = P > 0) only a snapshot at
    or after P can be continued by what the log retains (the events up to P are gone): an older
    one is never returned (folding on from it would silently miss them), and with ``before`` the
    oldest snapshot at or after P stands in for the newest before it. A snapshot that cannot be
    read is passed over for the next candidate (older, then, with ``before``, newer) when
    ``unreadable`` is given, which gets one line per such snapshot (a trial: a truncated newest
    snapshot made the controller refuse to start on a pruned log though an older readable one
    covered the prune). None on a pruned log means the projection cannot be rebuilt
    (:func:`unrebuildable` says why, for an error).

    Raises:
        ValueError: a snapshot is unreadable or is not at its stated position, and
            ``unreadable`` is None.
    """
    version = code_version()
    pruned = events.pruned_up_to()
    for position, payload in _candidates(events, version, before, pruned):
        try:
            return _loaded(position, bytes(payload))
        except ValueError as exc:
            if unreadable is None:
                raise
            unreadable.append(f"the snapshot at position {position}: {exc}")
    return None


def _candidates(events: Any, version: str, before: int | None, pruned: int) -> Iterator[tuple[int, bytes]]:
    """``(position, payload)`` of the snapshots :func:`latest` may start from, best first: the
    newest at or before ``before`` (None: the newest of all), then older ones, none below
    ``pruned``; then, with ``before`` on a pruned log, those after ``before``, oldest first."""
    upto = before
    while True:
        found = events.load_snapshot(PROJECTION, version) if upto is None else events.snapshot_before(PROJECTION, upto, version)
        if found is None or found[0] < pruned:
            break
        yield found
        upto = found[0] - 1
    if before is None or not pruned:
        return
    since = max(pruned, before + 1)
    while (found := events.snapshot_from(PROJECTION, since, version)) is not None:
        yield found
        since = found[0] + 1


def unrebuildable(events: Any, unreadable: list[str] | None = None) -> str | None:
    """Why this release cannot rebuild the projection from ``events`` (one sentence, for an
    error), or None when it can fold the log from a snapshot or from its start.

    It cannot when the log was pruned and no snapshot of this code version at or after the last
    pruned position exists (a release that changes the state's version after a prune;
    ``docs/storage.md``), or when those that exist cannot be read (``unreadable``: what
    :func:`latest` found): the events before them are gone, so refolding instead would build a
    state that silently misses them.
    """
    pruned = events.pruned_up_to()
    if not pruned:
        return None
    gone = f"the event log was pruned up to position {pruned}"
    if unreadable:
        return (
            f"{gone} and this release's snapshots after it cannot be read ({'; '.join(unreadable)}), so the events a "
            "rebuild needs are gone: load the events prune exported back with `backfill db restore FILE` and start "
            "again (docs/storage.md, Upgrading after a prune)"
        )
    if events.snapshot_from(PROJECTION, pruned, code_version()) is not None:
        return None
    return (
        f"{gone} and holds no snapshot of this release's projection (code version {code_version()}) at or after it, "
        f"so the events a rebuild needs are gone: {_WAYS_BACK}"
    )


_WAYS_BACK = (
    "run the release that wrote the snapshot (backfill db prune printed its code version; `backfill db shell`: "
    "SELECT code_version, position FROM snapshots), or load the events "
    "prune exported back with `backfill db restore FILE` and start again (docs/storage.md, Upgrading after a prune)"
)


def save(events: Any, world: World, keep: int | None = None) -> None:
    """Save ``world`` as the newest snapshot (with its checkpoint, in one transaction), keeping
    the newest ``keep`` (None: the store's default)."""
    events.save_snapshot(PROJECTION, world.position, code_version(), dump_world(world), keep=keep)


def payloads(events: Any, after: int, batch_size: int = 20000, *, lean: bool = False) -> Iterator[list[tuple[int, Any]]]:
    """``(position, event)`` batches of the log after ``after``, decoded (``lean``: for a caller
    that only folds them, every event in its compiled form, see
    :func:`backfill.core.events.decode_rows`)."""
    for batch in events.read_payloads(after, batch_size=batch_size):
        yield decode_rows(batch, lean=lean)


class PrunedMeanwhile(ValueError):
    """The log was pruned past the position a reader had reached: the events in between are
    gone, and folding on would silently miss them."""


def pruned_past(events: Any, position: int, first: int) -> int:
    """The position the log was pruned up to past ``position``, when the next event read after
    it is at ``first``; else 0. Only a gap (``first > position + 1``) asks the store: a gap an
    append that rolled back left is not a prune."""
    if first <= position + 1:
        return 0
    pruned = events.pruned_up_to()
    return pruned if pruned > position else 0


def replay(events: Any, auditor: Auditor, *, after: int = 0, progress: Callable[[int], None] | None = None) -> int:
    """Feed every event after ``after`` to ``auditor`` (whose world is folded up to ``after``);
    returns the number of events fed.

    Raises:
        backfill.core.events.EventDecodeError: a stored event no class accepts.
        PrunedMeanwhile: ``backfill db prune`` dropped events after the last one fed.
    """
    n = 0
    last = after
    for batch in payloads(events, after):
        if pruned := pruned_past(events, last, batch[0][0]):
            raise PrunedMeanwhile(
                f"the event log was pruned up to position {pruned} while it was read (at position {last}): "
                "run it again (it then starts from a newer snapshot)"
            )
        last = batch[-1][0]
        auditor.feed_many(batch)
        n += len(batch)
        if progress is not None:
            progress(len(batch))
    return n


def first_position_at(events: Any, since: Any) -> int | None:
    """The first position whose event happened at or after ``since`` (UTC), or None."""
    it: Iterable[Any] = events.read(0, since=since, batch_size=1)
    for row in it:
        return int(row.position)
    return None
