"""Retention of the event log: its partitions, and pruning the ones a snapshot covers.

Design: partitions by *position range*, idempotency keys in their own table
----------------------------------------------------------------------------
``events`` is a declaratively partitioned table, ``PARTITION BY RANGE (position)``, one
partition per ``partition_size`` positions (default 1,000,000: about a day of a platform with
1,000 busy models) named ``events_p<first position, 12 digits>``. Why position and not a
timestamp:

- every read of the log is ``position > p ORDER BY position LIMIT n`` (tailing, replay, the
  snapshot tail). With position ranges the planner prunes every partition below ``p`` and reads
  one or two; partitioned by time, each read would probe the ``position`` index of every
  partition (a year of days: 365 probes per batch).
- a partitioned table's PRIMARY KEY and UNIQUE constraints must include the partition key.
  ``PRIMARY KEY (position)`` does, so positions stay globally unique with no extra column.
- retention still works in time: positions are handed out under the log's write lock in commit
  order, so every partition covers one contiguous stretch of time, and :func:`prune` drops a
  partition only when its newest ``recorded_at`` is before the cut-off (it scans the candidate
  partitions for that; an admin command can afford it).

The idempotency key cannot be ``UNIQUE`` on the partitioned table (it does not contain the
partition key), so keys live in the unpartitioned ``event_keys (idempotency_key PRIMARY KEY,
position)``: one index probe per key on append, wherever the original event lives. Pruning a
partition deletes its keys too, so idempotency holds within the retained log (a fact
re-delivered with a key older than the prune horizon would be appended again, at a new
position); watch re-deliveries and relists happen within minutes, retention is days.

Partitions are created ahead by the appends themselves (:func:`ensure_partitions`, called under
the write lock whenever the newest position comes within half a partition of the last
partition's end): ``CREATE TABLE ... (LIKE events)`` plus ``ATTACH PARTITION`` takes only a
SHARE UPDATE EXCLUSIVE lock on ``events``, which blocks neither readers nor other writers.
There is no DEFAULT partition: a position no partition covers is an error, not a silent slow
path.

Pruning
-------
:func:`prune` drops, oldest first, every partition that (1) is wholly below the current head,
(2) holds no event recorded at or after the cut-off, (3) is covered by a snapshot of the
given name and code version (its last position <= the snapshot's position) and (4) is behind
every checkpoint (no projection still has to fold it). It stops at the first partition that
fails one of these, so the retained log is always a suffix. With ``export`` each dropped
partition is first written with ``COPY ... TO STDOUT`` (CSV with a header) into the
file, and the file synced to disk before the drop commits; an export cut off mid-row (a full
disk, a killed prune) is cut back to its last whole row, so the file stays loadable and the
partition, not dropped, is exported again by the next prune. The ``runs`` table is never
touched.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

#: Positions per partition unless configured (Settings.event_partition_size).
DEFAULT_PARTITION_SIZE = 1_000_000

_BOUND_RE = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of ``events``: positions ``lo <= position < hi``."""

    name: str
    lo: int
    hi: int


def partition_name(lo: int) -> str:
    """The name of the partition starting at position ``lo``."""
    return f"events_p{lo:012d}"


_PARTITION_NAME_RE = re.compile(r"events_p\d{12,}")


def is_partition_name(name: str | None) -> bool:
    """True for a name :func:`partition_name` gives (schema comparisons skip partitions: they
    come and go at run time, the models describe only the partitioned parent)."""
    return bool(name) and _PARTITION_NAME_RE.fullmatch(name) is not None  # type: ignore[arg-type]


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic ``include_name`` hook for schema comparisons: skip Alembic's own version table
    (reflected without its schema) and the partitions of ``events`` with their indexes."""
    if type_ == "table":
        return not (name == "alembic_version" or is_partition_name(name))
    if type_ == "index" and isinstance(parent_names, dict):
        return not is_partition_name(parent_names.get("table_name"))
    return True


def list_partitions(conn: psycopg.Connection[Any]) -> list[Partition]:
    """The partitions of ``events`` in the connection's schema, by position. One that a prune
    is detaching meanwhile (the catalog gives it no bound any more) is left out: it is leaving
    (a trial: a ``replay`` during a prune died on it with a traceback)."""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'events'::regclass"
    ).fetchall()
    out = []
    for name, bound in rows:
        if bound is None:
            continue
        m = _BOUND_RE.search(bound)
        if m is None:  # pragma: no cover - only range partitions are ever created
            raise RuntimeError(f"partition {name} of events has an unexpected bound: {bound!r}")
        out.append(Partition(name, int(m.group(1)), int(m.group(2))))
    out.sort(key=lambda p: p.lo)
    return out


def pruned_up_to(parts: Sequence[Partition]) -> int:
    """The last position ``backfill db prune`` dropped, given :func:`list_partitions`: the
    first partition's first position minus one (partitions start at position 1 and only a
    prune drops one), 0 when it never dropped any."""
    return parts[0].lo - 1 if parts and parts[0].lo > 1 else 0


def ensure_partitions(conn: psycopg.Connection[Any], last: int, size: int) -> int:
    """Make sure partitions cover every position up to ``last + size // 2``; return the end
    (exclusive) of the last partition.

    Call it under the log's write lock (the appends do), inside the caller's transaction. A
    new partition is created empty and attached (SHARE UPDATE EXCLUSIVE on ``events``).
    """
    if size < 1:
        raise ValueError("partition size must be >= 1")
    parts = list_partitions(conn)
    hi = parts[-1].hi if parts else 1
    while hi <= last + size // 2:
        name = partition_name(hi)
        conn.execute(f'CREATE TABLE "{name}" (LIKE events INCLUDING DEFAULTS)')
        conn.execute(f'ALTER TABLE events ATTACH PARTITION "{name}" FOR VALUES FROM ({hi}) TO ({hi + size})')
        hi += size
    return hi


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :func:`prune` did.

    Attributes:
        dropped: the partitions dropped, oldest first.
        events: how many events they held.
        exported: how many events were written to the export file (0 without one).
        stopped: why it stopped before the next partition (one line), or None when nothing
            older than the cut-off was left.
        trimmed: bytes of an incomplete last row cut off the export file before appending to
            it (:func:`open_export`), 0 when it ended with a whole row.
    """

    dropped: tuple[Partition, ...]
    events: int
    exported: int
    stopped: str | None
    trimmed: int = 0


def prune(
    conn: psycopg.Connection[Any],
    before: datetime,
    *,
    snapshot: str,
    code_version: str,
    export: Path | None = None,
    readable: Callable[[int, bytes], bool] | None = None,
) -> PruneResult:
    """Drop the oldest partitions of ``events`` that a snapshot covers (see the module notes).

    Args:
        conn: a psycopg connection on the store's schema, not in a transaction; each partition
            is exported and dropped in its own transaction (committed here).
        before: timezone-aware cut-off: only partitions whose events were all recorded before
            it are dropped.
        snapshot, code_version: the snapshot that must cover a partition (name and version, as
            the controller loads it: an older code version's snapshot does not count, since the
            controller would refold from the log).
        export: optional file; before each drop the partition's rows are appended to it
            (``COPY`` CSV, a header line when the file is new; ``COPY events FROM ... (FORMAT
            csv, HEADER)`` loads it back). It is opened (created) only when there are rows to
            export: when nothing is, it is neither created nor touched.
        readable: ``(position, payload) -> bool``, whether a snapshot can be started from; the
            newest one that can covers (a review: a corrupt newest snapshot counted, and the
            prune dropped what the only readable one needed). None: the newest covers.

    Returns:
        a :class:`PruneResult`; ``dropped`` is empty and ``stopped`` says why when nothing
        could be dropped.

    Raises:
        ValueError: ``before`` is naive, or :func:`export_problem` names a problem of ``export``
            (checked before anything is dropped).
        OSError: the export file cannot be written (nothing of that partition is dropped).
    """
    if before.tzinfo is None:
        raise ValueError("'before' must be timezone-aware")
    problem = export_problem(export) if export is not None else None
    if problem:
        raise ValueError(problem)
    # One prune or restore at a time (a trial: a restore committed between this prune's list of
    # partitions and its drops, and the drops then left a hole above the restored positions).
    conn.execute(_RETENTION_LOCK)
    try:
        return _prune(conn, before, snapshot=snapshot, code_version=code_version, export=export, readable=readable)
    finally:
        try:
            conn.execute(_RETENTION_UNLOCK)
        except psycopg.Error:  # a broken session holds no lock: keep the original error
            pass


#: Prune and restore serialize on this session/transaction advisory lock (per schema); appends
#: do not take it (they take the log's write lock, :mod:`backfill.store.eventlog`).
_RETENTION_LOCK = "SELECT pg_advisory_lock(1650879592, hashtext(current_schema()))"
_RETENTION_UNLOCK = "SELECT pg_advisory_unlock(1650879592, hashtext(current_schema()))"
_RETENTION_XACT_LOCK = "SELECT pg_advisory_xact_lock(1650879592, hashtext(current_schema()))"


def _prune(
    conn: psycopg.Connection[Any],
    before: datetime,
    *,
    snapshot: str,
    code_version: str,
    export: Path | None,
    readable: Callable[[int, bytes], bool] | None,
) -> PruneResult:
    with conn.transaction():
        head = int(conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0])  # type: ignore[index]
        covered = None
        if readable is None:
            row = conn.execute(
                "SELECT max(position) FROM snapshots WHERE name = %s AND code_version = %s", (snapshot, code_version)
            ).fetchone()
            covered = int(row[0]) if row and row[0] is not None else None
        else:
            passed_over = 0
            for position, payload in conn.execute(
                "SELECT position, payload FROM snapshots WHERE name = %s AND code_version = %s ORDER BY position DESC",
                (snapshot, code_version),
            ):
                if readable(int(position), bytes(payload)):
                    covered = int(position)
                    break
                passed_over += 1
        checkpoints = conn.execute("SELECT name, position FROM checkpoints ORDER BY position, name").fetchall()
        parts = list_partitions(conn)
        if export is not None and (problem := _export_of_another_log(conn, export, parts)):
            raise ExportRefused(problem)
    dropped: list[Partition] = []
    events = exported = trimmed = 0
    stopped: str | None = None
    fh = None  # the export file, opened at the first partition with rows: nothing exported, no file
    try:
        for part in parts:
            last = part.hi - 1
            if covered is None:
                unread = f" this release can read ({passed_over} cannot be read)" if readable is not None and passed_over else ""
                stopped = f"no snapshot {snapshot!r} of code version {code_version!r}{unread}: nothing is covered"
                break
            if last > head:
                stopped = f"partition {part.name} (positions {part.lo}-{last}) is not full yet (head {head})"
                break
            if covered < last:
                stopped = f"partition {part.name} ends at position {last}, after snapshot {snapshot!r} at {covered}"
                break
            behind = [(n, p) for n, p in checkpoints if p < last]
            if behind:
                n, p = behind[0]
                stopped = f"partition {part.name} ends at position {last}, after checkpoint {n!r} at {p}"
                break
            with conn.transaction():
                newest, count = conn.execute(f'SELECT max(recorded_at), count(*) FROM "{part.name}"').fetchone()  # type: ignore[misc]
                if newest is not None and newest >= before:
                    stopped = f"partition {part.name} holds events recorded until {newest.isoformat()}, not before {before.isoformat()}"
                    break
                if export is not None and count:
                    if fh is None:
                        fh, trimmed = open_export(export)
                    _export_partition(conn, part.name, fh)
            if export is not None and count:
                # On disk before the drop commits; outside a transaction (a sync may take long, and
                # the session's idle-in-transaction timeout is on). The partition cannot change
                # meanwhile: it lies below the head, and restores wait for the retention lock.
                os.fsync(fh.fileno())  # type: ignore[union-attr]
                exported += count
            with conn.transaction():
                # The keys of this partition's events only: a key appended again after an earlier
                # prune and then restored (a review) belongs to the retained event it names.
                conn.execute(
                    f'DELETE FROM event_keys k USING "{part.name}" p '
                    "WHERE k.idempotency_key = p.idempotency_key AND k.position = p.position"
                )
                conn.execute(f'ALTER TABLE events DETACH PARTITION "{part.name}"')
                conn.execute(f'DROP TABLE "{part.name}"')
                conn.execute(
                    "INSERT INTO pruned_partitions (lo, hi, events, export) VALUES (%s, %s, %s, %s)",
                    # the absolute path: the table is read from wherever a restore runs (a trial: `rel.csv`)
                    (part.lo, part.hi, int(count), os.path.abspath(export) if export is not None and count else None),
                )
            dropped.append(part)
            events += int(count)
    finally:
        if fh is not None:
            fh.close()
    if stopped is None and not dropped:
        stopped = "the log has no partitions"
    return PruneResult(tuple(dropped), events, exported, stopped, trimmed)


def open_export(export: Path) -> tuple[Any, int]:
    """Open (create) ``export`` for :func:`prune` to append to, unbuffered (``FileIO``: no
    buffer of ours holds a part row), and cut an incomplete last row off it: a row without its
    line end is what an interrupted export leaves (a full disk, a prune killed mid-write; an
    adversarial trial: the next prune appended its rows to the cut-off one, exited 0, and
    ``db restore`` refused the file). That row's partition was not dropped (the drop commits
    after its export is on disk), so the row is exported again. A new file's directory entry is
    synced to disk.

    Returns:
        ``(file, bytes cut off)``.

    Raises:
        OSError: the file cannot be opened, read or cut.
    """
    new = not export.exists()
    fh = open(export, "a+b", buffering=0)  # noqa: SIM115 - the caller closes it
    try:
        size, pos, tail = _tail(fh, 1)
        end = tail.rfind(b"\n")
        keep = pos + end + 1 if end >= 0 else 0  # back to the last line end
        if keep < size:
            fh.truncate(keep)
            os.fsync(fh.fileno())
        fh.seek(0, os.SEEK_END)
        if new:
            _sync_directory(export)
    except BaseException:
        fh.close()
        raise
    return fh, size - keep


def _export_partition(conn: psycopg.Connection[Any], name: str, fh: Any) -> None:
    """Append partition ``name``'s rows to ``fh`` (from :func:`open_export`) as CSV, with the
    header line when the file is empty (the caller syncs them to disk). On any error (a full
    disk) the file is cut back to where it was, so it never ends in a part row.

    Raises:
        OSError: the file cannot be written; psycopg.Error: the rows cannot be read.
    """
    start = fh.seek(0, os.SEEK_END)
    header = "" if start else ", HEADER"
    pending = bytearray()
    try:
        with conn.cursor() as cur, cur.copy(
            f'COPY (SELECT position, recorded_at, type, version, stream, idempotency_key, at, data '
            f'FROM "{name}" ORDER BY position) TO STDOUT (FORMAT csv{header})'
        ) as copy:
            for chunk in copy:  # a row each
                pending += chunk
                if len(pending) >= 1 << 20:
                    _write_all(fh, pending)
                    pending.clear()
        _write_all(fh, pending)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fh.fileno(), start)
        raise


def _write_all(fh: Any, data: bytearray) -> None:
    """Write all of ``data`` to the unbuffered ``fh`` (a raw write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[fh.write(view) :]


def _sync_directory(path: Path) -> None:
    """Sync ``path``'s directory entry to disk (best effort: not every file system can)."""
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class RestoreError(ValueError):
    """A restore refused before writing anything; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :func:`restore` loaded: ``events`` rows at positions ``first``..``last`` into the
    new partition ``partition`` (positions 1 to the last pruned one), ``keys`` idempotency
    keys (a key re-appended after the prune keeps its newer position), and ``repeated`` rows
    the files gave more than once (loaded once)."""

    events: int
    first: int
    last: int
    partition: Partition
    keys: int
    repeated: int = 0


_COLUMNS = "position, recorded_at, type, version, stream, idempotency_key, at, data"


def restore(
    conn: psycopg.Connection[Any], sources: Sequence[Path], lock_log: Callable[[], None], *, missing_start_ok: bool = False
) -> RestoreResult:
    """Load the events ``backfill db prune --export`` wrote back into the log, below what it
    retains, so that it starts at position 1 again: the way back for a release that cannot
    start from the snapshots of a pruned log (a change of the state's code version,
    ``docs/storage.md``). All or nothing, inside the caller's transaction. It takes the
    retention lock first (no prune meanwhile), loads and checks the files, and only then the
    log's write lock (``lock_log``, e.g. :meth:`backfill.store.eventlog.AppendTransaction.lock`),
    after it has filled the new partition, so appends wait only for the attach and the insert
    of the keys, not for the loading, the checks or the rows' insert.

    The rows go into one new partition, positions 1 to the last pruned position (so
    ``pruned_up_to()`` is 0 again, and a later prune drops it whole once a snapshot covers it).
    Their idempotency keys go back into ``event_keys``, except a key re-appended since the prune
    (it keeps its newer position).

    Args:
        conn: a psycopg connection on the store's schema, inside the caller's transaction.
        lock_log: takes the log's write lock in that transaction (held to its end).
        sources: the export files (CSV with a header line, as prune writes them: one file per
            prune, or one appended to by several), read together; a row given more than once
            (a prune after a restore exports the restored rows again) is loaded once.
        missing_start_ok: the rows start above position 1 and the positions before them were
            never stored (the log's first appends rolled back), not pruned without an export:
            restore anyway. Otherwise that is refused, since a refold from position 1 would then
            silently miss the events not given. Needed only below the partitions prune recorded
            (``pruned_partitions``, revision 0004): those are checked by their event counts.

    Returns:
        a :class:`RestoreResult`.

    Raises:
        RestoreError: the log was never pruned; a file that is not such a CSV (another header,
            or a row this release cannot decode); no rows; a position given twice with different
            contents; a position the log retains or below 1; a dropped partition given with
            another number of events than prune recorded; a missing start (see
            ``missing_start_ok``). Nothing is written.
        OSError: a file cannot be read.
    """
    conn.execute(_RETENTION_XACT_LOCK)  # no prune in between (held to the caller's commit)
    parts = list_partitions(conn)
    pruned = pruned_up_to(parts)
    if not pruned:
        raise RestoreError("the event log holds every position from 1 (never pruned, or restored already): nothing to restore")
    for source in sources:
        _check_header(source)
    conn.execute(
        "CREATE TEMP TABLE restored_events (position bigint, recorded_at timestamptz, type text, version smallint, "
        "stream text, idempotency_key text, at timestamptz, data jsonb) ON COMMIT DROP"
    )
    for source in sources:
        try:
            with open(source, "rb") as fh, conn.cursor() as cur, cur.copy(
                f"COPY restored_events ({_COLUMNS}) FROM STDIN (FORMAT csv, HEADER)"
            ) as copy:
                while chunk := fh.read(1 << 20):
                    copy.write(chunk)
        except psycopg.Error as exc:  # a file in another format: say so, not only what the server says
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            where = _copy_line(exc)
            if where:  # which line to look at (a trial: "extra data after last expected column", no line)
                why = f"{why} ({where})"
            raise RestoreError(f"{source}: not an export of backfill db prune (CSV with a header line: {_COLUMNS}): {why}") from None
    # The same row given more than once is loaded once: an export file appended to by a prune
    # after a restore holds the restored rows twice, and so do two files of overlapping prunes.
    conn.execute("CREATE TEMP TABLE restored_rows ON COMMIT DROP AS SELECT DISTINCT * FROM restored_events")
    given = conn.execute("SELECT count(*) FROM restored_events").fetchone()[0]  # type: ignore[index]
    n, first, last, distinct, nulls = conn.execute(
        "SELECT count(*), min(position), max(position), count(DISTINCT position), count(*) FILTER (WHERE num_nulls("
        f"{_COLUMNS}) > 0) FROM restored_rows"
    ).fetchone()  # type: ignore[misc]
    names = ", ".join(str(p) for p in sources)
    if not n:
        raise RestoreError(f"{names}: no events")
    if nulls:
        raise RestoreError(f"{names}: {nulls} row(s) with an empty column: not an export of backfill db prune")
    if distinct != n:
        twice = conn.execute("SELECT position FROM restored_rows GROUP BY position HAVING count(*) > 1 ORDER BY 1 LIMIT 1").fetchone()[0]  # type: ignore[index]
        raise RestoreError(f"{names}: position {twice} is given twice with different contents (exports of two different logs?)")
    if first < 1:
        raise RestoreError(f"{names}: position {first} is not a position of the log (they start at 1)")
    if last > pruned:
        raise RestoreError(
            f"{names}: position {last} is not a pruned one (the log was pruned up to position {pruned} and retains the rest)"
        )
    # Every partition prune recorded must come back whole: as many events in its range as it
    # held when dropped (positions have gaps where appends rolled back, so only the count tells
    # a missing export from a gap).
    conn.execute("CREATE INDEX ON restored_rows (position)")
    recorded = conn.execute("SELECT lo, hi, events FROM pruned_partitions WHERE lo <= %s ORDER BY lo", (pruned,)).fetchall()
    for lo, hi, count in recorded:
        inside = conn.execute("SELECT count(*) FROM restored_rows WHERE position >= %s AND position < %s", (lo, hi)).fetchone()[0]  # type: ignore[index]
        if inside != count:
            raise RestoreError(
                f"{names}: positions {lo}-{hi - 1} held {count:,} events when backfill db prune dropped them, the files give "
                f"{inside:,} (an export missing, or one of another log? `backfill db shell`: SELECT * FROM pruned_partitions)"
            )
    # Below what prune recorded (positions 1 to ``unrecorded - 1``: pruned before revision 0004)
    # only the start can be checked.
    unrecorded = recorded[0][0] if recorded else pruned + 1
    if unrecorded > 1 and first > 1 and not missing_start_ok:
        raise RestoreError(
            f"{names}: the events start at position {first}, so positions 1-{min(first, unrecorded) - 1} are missing "
            "(pruned into another export? give every file at once); if they were never stored (the log's first "
            "appends rolled back), pass --missing-start-ok"
        )
    _decode_all(conn, names)
    # The partition is filled and indexed before the log's write lock: a table outside the log
    # until it is attached, so appends go on meanwhile. ATTACH then builds nothing and scans
    # nothing: it adopts the indexes that match the log's (its primary key and stream index),
    # and the CHECK constraint that matches the bound spares the validating scan.
    part = Partition(partition_name(1), 1, pruned + 1)
    conn.execute(f'CREATE TABLE "{part.name}" (LIKE events INCLUDING DEFAULTS)')
    conn.execute(f'INSERT INTO "{part.name}" ({_COLUMNS}) SELECT {_COLUMNS} FROM restored_rows')
    conn.execute(f'ALTER TABLE "{part.name}" ADD PRIMARY KEY (position)')
    conn.execute(f'CREATE INDEX ON "{part.name}" (stream)')
    conn.execute(
        f'ALTER TABLE "{part.name}" ADD CONSTRAINT "{part.name}_bound" '
        f"CHECK (position IS NOT NULL AND position >= {part.lo} AND position < {part.hi})"
    )
    # Appends wait from here to the commit: the keys go in under the lock, since an append of a
    # restored key meanwhile would wait for this transaction while holding the lock we would
    # then wait for (a deadlock PostgreSQL breaks by failing one of them).
    lock_log()
    conn.execute(f'ALTER TABLE events ATTACH PARTITION "{part.name}" FOR VALUES FROM ({part.lo}) TO ({part.hi})')
    conn.execute(f'ALTER TABLE "{part.name}" DROP CONSTRAINT "{part.name}_bound"')
    keys = conn.execute(
        "INSERT INTO event_keys (idempotency_key, position) SELECT idempotency_key, position FROM restored_rows "
        "ON CONFLICT (idempotency_key) DO NOTHING"
    ).rowcount
    conn.execute("DELETE FROM pruned_partitions WHERE lo <= %s", (pruned,))  # restored: the log holds them again
    return RestoreResult(int(n), int(first), int(last), part, int(keys), int(given) - int(n))


_HEADER = _COLUMNS.replace(" ", "")


def _copy_line(exc: psycopg.Error) -> str:
    """``line N`` of a COPY error's context (``COPY restored_events, line 47546: ...``), or ""."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    m = re.search(r"\bline (\d+)", context)
    return f"line {m.group(1)}" if m else ""


def export_problem(export: Path) -> str | None:
    """Why ``export`` cannot take a prune's rows (one line), or None: it must be a new file in an
    existing directory, or a regular file that is empty or starts with the export's header (an
    earlier export appended to). A day-2 trial: a prune appended its rows to a file of notes,
    which ``db restore`` then refused, and ``--export`` naming a FIFO hung. Never raises."""
    try:
        if not export.exists():
            return None if export.parent.is_dir() else f"--export {export}: give a file in an existing directory"
        if not export.is_file():
            return f"--export {export}: not a regular file (a prune appends its rows to a CSV file)"
        if export.stat().st_size == 0:
            return None
        _check_header(export)
    except RestoreError:
        return f"--export {export}: the file exists and is not an export of backfill db prune (its first line is not {_HEADER!r}); give a new file or an earlier export"
    except OSError as exc:
        return f"--export {export}: {exc.strerror or exc}"
    return None


class ExportRefused(ValueError):
    """``--export`` names a file that must not take this log's rows (the message says why, in
    one line); nothing was dropped."""


def _export_of_another_log(conn: psycopg.Connection[Any], export: Path, parts: Sequence[Partition]) -> str | None:
    """Why ``export``, a file that :func:`export_problem` accepts, must not take this log's
    rows (one line), or None. Its last row must be of this log: an event the log still holds
    under the same idempotency key (its partition restored: a prune exports it again, and a
    restore loads the copies once), or one this log pruned into this same file (or before
    ``pruned_partitions`` recorded where).
    A trial: an export of another schema took this one's positions 1-11000 after its own
    1-1000, and ``db restore`` refused the file, the only copy of both.

    Raises:
        OSError: the file cannot be read.
    """
    last = _last_row(export) if export.exists() else None
    if last is None:
        return None
    try:
        position, key = int(last[0]), last[5]
    except (IndexError, ValueError):
        return f"--export {export}: its last line is not a row of an export of backfill db prune; give a new file"
    held = conn.execute("SELECT idempotency_key FROM events WHERE position = %s", (position,)).fetchone()
    pruned = pruned_up_to(parts)
    if held is not None:
        if held[0] == key:
            return None
    elif position <= pruned:
        # Pruned by this log: into this very file (a prune records where each partition went;
        # a trial: another schema's export whose last position lay below this log's prune
        # passed a check of the position alone), or before revision 0004 (nothing recorded).
        went = conn.execute("SELECT export FROM pruned_partitions WHERE lo <= %s AND %s < hi", (position, position)).fetchone()
        if went is None:
            return None
        if went[0] and os.path.realpath(went[0]) == os.path.realpath(export):
            return None
        into = f"exported to {went[0]}" if went[0] else "dropped without an export"
        return (
            f"--export {export}: its last row (position {position:,}) is not this log's export of that position (it was "
            f"{into}): an export of another log? give a new file"
        )
    return (
        f"--export {export}: its last row (position {position:,}) is not an event of this log "
        f"({'pruned up to position ' + format(pruned, ',') if pruned else 'never pruned'}): an export of another log? give a new file"
    )


def _tail(fh: Any, line_ends: int) -> tuple[int, int, bytes]:
    """``(size, offset, bytes from offset to the end)`` of the shortest tail of the binary file
    ``fh`` (read back in 64 KiB steps) that holds ``line_ends`` line ends, or of the whole file
    when it holds fewer: what :func:`open_export` cuts back to and :func:`_last_row` reads."""
    size = fh.seek(0, os.SEEK_END)
    pos, tail, found = size, b"", 0
    while pos > 0 and found < line_ends:
        step = min(1 << 16, pos)
        pos -= step
        fh.seek(pos)
        chunk = fh.read(step)
        found += chunk.count(b"\n")
        tail = chunk + tail
    return size, pos, tail


def _last_row(export: Path) -> list[str] | None:
    """The last whole CSV row of ``export`` (the header counts as none), or None."""
    import csv

    with open(export, "rb") as fh:
        _, pos, tail = _tail(fh, 3)  # the last whole line and the line end before it
    lines = tail.split(b"\n")
    whole = lines[:-1] if pos == 0 else lines[1:-1]  # the part after the last line end is cut off by open_export
    whole = [line for line in whole if line.strip()]
    if not whole:
        return None
    row = next(csv.reader([whole[-1].decode("utf-8", "replace")]), None)
    if row is None or ",".join(row) == _HEADER:
        return None
    return row


def _check_header(source: Path) -> None:
    """Refuse a file whose first line is not prune's CSV header (``COPY ... HEADER`` only skips
    it: a file with its columns in another order loaded its keys as streams, a trial found).

    Raises:
        RestoreError: another first line. OSError: the file cannot be read.
    """
    with open(source, "rb") as fh:
        first = fh.readline(4096)
    text = first.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace").strip()
    if text != _HEADER:
        raise RestoreError(f"{source}: not an export of backfill db prune: its first line is {text[:80]!r}, not {_HEADER!r}")


def _decode_all(conn: psycopg.Connection[Any], names: str, batch: int = 20000) -> None:
    """Decode every row to be restored as a refold will (a trial: rows of an unknown type, or
    ``data`` that no event class accepts, were loaded, and the release the restore was for
    could then not start).

    Raises:
        RestoreError: naming the first position that does not decode.
    """
    from backfill.core.events import EventDecodeError, decode_rows

    after = 0
    while True:
        rows = conn.execute(
            "SELECT position, type, version, data::text FROM restored_rows WHERE position > %s ORDER BY position LIMIT %s",
            (after, batch),
        ).fetchall()
        if not rows:
            return
        try:
            decode_rows(rows)
        except EventDecodeError as exc:  # the first row that does not decode, by its position
            raise RestoreError(f"{names}: the event at position {exc.position} cannot be read by this release: {exc.reason}") from None
        after = rows[-1][0]


def relation_sizes(conn: psycopg.Connection[Any], names: Sequence[str] = ("events", "event_keys", "snapshots", "runs")) -> dict[str, int]:
    """``pg_total_relation_size`` (bytes: heap, TOAST and indexes) of each named table; for the
    partitioned ``events``, the sum over its partitions."""
    out: dict[str, int] = {}
    for name in names:
        if name == "events":
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i WHERE i.inhparent = 'events'::regclass"
            ).fetchone()
        else:
            row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (name,)).fetchone()
        out[name] = int(row[0])  # type: ignore[index]
    return out


__all__ = [
    "DEFAULT_PARTITION_SIZE",
    "Partition",
    "PruneResult",
    "RestoreError",
    "RestoreResult",
    "partition_name",
    "is_partition_name",
    "include_name",
    "list_partitions",
    "ensure_partitions",
    "export_problem",
    "open_export",
    "prune",
    "restore",
    "relation_sizes",
]
