"""``events.construct`` (no validation, for the project's own events) gives what validation gives;
so does ``events.materialize`` of ``events.build`` (the compiled form the simulator folds)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from backfill.core import events as ev

from .test_decode import _example

T0 = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc)


def _values(cls: type, n: int, *, defaults: bool) -> dict[str, Any]:
    """Values for every field of ``cls`` (only the required ones when ``defaults``), taken from
    the decode tests' example with every field set to a non-default value."""
    values = dict(_example(cls, n).__dict__)
    values.pop("type")
    return {k: v for k, v in values.items() if not defaults or cls.model_fields[k].is_required()}


def _hash(e: Any) -> Any:
    try:
        return hash(e)
    except TypeError as exc:  # a dict field: unhashable either way
        return str(exc)


def _built(cls: type, **values: Any) -> Any:
    return ev.materialize(ev.build(cls, **values))


@pytest.mark.parametrize("cls", list(ev.EVENT_TYPES.values()), ids=lambda c: c.__name__)
@pytest.mark.parametrize("defaults", [False, True], ids=["all fields", "required only"])
@pytest.mark.parametrize("make", [ev.construct, _built], ids=["construct", "materialize(build)"])
def test_construct_equals_validation_for_every_event_type(cls: type, defaults: bool, make: Any) -> None:
    values = _values(cls, 3, defaults=defaults)
    built, validated = make(cls, **values), cls(**values)
    assert type(built) is cls and built == validated
    assert built.model_dump() == validated.model_dump() and built.model_dump_json() == validated.model_dump_json()
    assert repr(built) == repr(validated)
    assert _hash(built) == _hash(validated)
    assert ev.encode(built, "k") == ev.encode(validated, "k")
    assert built.stream == validated.stream and built.natural_key() == validated.natural_key()
    assert ev.key_of(ev.build(cls, **values)) == validated.natural_key()  # the compiled form's key
    assert ev.decode(*(lambda r: (r.type, r.version, r.data))(ev.encode(built, "k"))) == validated


def test_construct_refuses_unknown_missing_and_fixed_fields() -> None:
    with pytest.raises(TypeError, match="missing \\['backfill'\\]"):
        ev.construct(ev.JobCreated, at=T0, namespace="ns", name="j")
    with pytest.raises(TypeError, match="bogus"):
        ev.construct(ev.JobCreated, at=T0, namespace="ns", backfill="b", name="j", bogus=1)
    with pytest.raises(TypeError, match="type"):
        ev.construct(ev.JobCreated, at=T0, namespace="ns", backfill="b", name="j", type="JobDeleted")
    with pytest.raises(TypeError, match="not an event class"):
        ev.construct(dict, at=T0)  # type: ignore[arg-type]


def test_constructed_events_are_frozen_like_validated_ones() -> None:
    e = ev.construct(ev.ForegroundRequest, at=T0, namespace="ns", model="m")
    with pytest.raises(Exception):
        e.model = "other"  # type: ignore[misc]
    assert e.count == 1 and e.source == "lastActiveTime" and e.busy_until is None  # defaults filled
