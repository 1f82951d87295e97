"""What the event log can store: no NUL character (U+0000) anywhere, and no indexed value
(a key, a stream) longer than a btree index row takes.

PostgreSQL holds no NUL in ``text`` and none in ``jsonb`` (``\\u0000`` is refused:
``UntranslatableCharacter``), yet a Kubernetes object may carry one in any string (the API
server stores JSON). Found by an adversarial trial: one GamingSession whose ``spec.nodeName``
ended in ``\\u0000``, in any namespace, made every append fail; the spool kept the record at its
head, and no ModelBackfill anywhere was admitted again until a restart (and at once again after
it while the object existed).

Two rules, each written once:

- :func:`backfill.core.events.encode` (every record the log stores passes it) replaces each NUL
  by U+FFFD (the replacement character) in the payload, the stream and the key. Lossy only in a
  character no name, node, mode, group or reason the controller compares can hold (the API server
  validates names; a string with a NUL never equals one without), so decisions are the same,
  unless another object holds a literal U+FFFD where this one held the NUL: then the stored
  strings are equal where the watched ones were not (and two keys may collide). The preemptor
  folds the watched form before it is stored; ``backfill replay`` the stored one.
- Content the controller *copies into a Job* (a ModelBackfill's ``spec``, a CronJob's
  ``jobTemplate``) is not silently changed: the translator records where the NUL was
  (``unstorable`` on ``BackfillApplied`` / ``CronJobSeen``) and the declaration is ``Blocked``
  (``InvalidSpec`` / ``InvalidTemplate``) with that message. No process can be given a NUL in an
  argument or an environment value either (C strings end at the first one).

And one more (a fault trial: a Model ``status.lastActiveTime`` with a 9,000-digit fraction,
which the API server accepts as a date-time, became a 9 kB idempotency key; PostgreSQL refused
every append, ``index row requires 9080 bytes, maximum size is 8191``, and nothing was admitted
anywhere until each replica restarted): :func:`bounded` cuts a key or stream over
:data:`MAX_INDEXED_CHARS` to its head and a digest of the whole, in
:func:`backfill.core.events.encode` too (and the translator a node name or group over
:data:`MAX_NAME_CHARS`). Two values that differ only past the head stay apart.
"""

from __future__ import annotations

import hashlib
from typing import Any

NUL = "\x00"
#: U+FFFD REPLACEMENT CHARACTER: what a NUL becomes in the log.
REPLACEMENT = "\ufffd"
#: A NUL as JSON writes it: a payload without this substring holds no NUL (the converse need not
#: hold: an escaped backslash followed by ``u0000`` is checked exactly by :func:`without_nul`).
JSON_NUL = "\\u0000"


#: Longest idempotency key or stream stored as it is (characters; at most 4 bytes each in UTF-8,
#: so 2,048 bytes, under the 2,704 a PostgreSQL btree row takes).
MAX_INDEXED_CHARS = 512
#: Longest node name or shared-GPU group kept as it is (a node name is a DNS subdomain of at
#: most 253 characters): a longer one, which no node can have, is kept bounded (a fault trial: a
#: GamingSession whose 900 kB ``spec.nodeName`` was copied into every event about it).
MAX_NAME_CHARS = 253
_DIGEST_CHARS = 72  # "…sha256:" and 64 hex digits


def bounded(text: str, limit: int = MAX_INDEXED_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its head and ``…sha256:<hex of
    the whole text>``, ``limit`` characters in all: equal for equal texts, distinct for distinct
    ones (an indexed column's value; a node name compared with others bounded alike)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:max(0, limit - _DIGEST_CHARS)]}\u2026sha256:{digest}"


def nul_path(value: Any, path: str) -> str:
    """The path (``path`` then ``.key`` / ``[index]``) of the first key or string in ``value``
    (JSON-shaped: dicts, lists, scalars) that holds a NUL, or "" when none does."""
    if isinstance(value, str):
        return path if NUL in value else ""
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}"
            if isinstance(k, str) and NUL in k:
                return sub
            found = nul_path(v, sub)
            if found:
                return found
        return ""
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = nul_path(v, f"{path}[{i}]")
            if found:
                return found
    return ""


def without_nul(value: Any) -> Any:
    """``value`` (JSON-shaped) with every NUL in its keys and strings replaced by U+FFFD; a new
    structure (the input is not changed)."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, dict):
        return {(k.replace(NUL, REPLACEMENT) if isinstance(k, str) else k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value


def unstorable_message(path: str) -> str:
    """The ``Blocked`` message for content with a NUL at ``path``."""
    return (
        f"{path.replace(NUL, REPLACEMENT)} contains a NUL character (U+0000): the event log cannot store it "
        "(PostgreSQL holds none) and no container can be given it"
    )


def storable_json(data: str) -> str:
    """``data`` (a JSON text) with every NUL in its strings and keys replaced by U+FFFD."""
    import json

    return json.dumps(without_nul(json.loads(data)), ensure_ascii=False, separators=(",", ":"))
