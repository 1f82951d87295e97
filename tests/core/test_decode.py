"""The log's decoding paths: the compiled fast path gives exactly what pydantic validation
gives for every row ``encode`` writes, and anything else falls back to validation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from backfill.core import events as ev

T0 = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=timezone.utc)


def _example(cls: type, n: int) -> Any:
    """An instance of ``cls`` with every field set to a non-default value."""
    values: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if name == "type":
            continue
        text = str(info.annotation)
        if "atetime" in text:
            values[name] = T0 + timedelta(seconds=n)
        elif "bool" in text:
            values[name] = n % 2 == 0
        elif "float" in text:
            values[name] = n + 0.25
        elif "dict" in text:
            values[name] = {"spec": {"nested": [1, 2.5, None, True, "héllo ✓"]}, "n": n}
        elif "bool" in text:
            values[name] = True
        elif "float" in text:
            values[name] = n + 0.25
        elif "int" in text:
            values[name] = n + 2
        else:
            values[name] = f"{name}-{n}"
    return cls(**values)


EXAMPLES = [_example(cls, i) for i, cls in enumerate(ev.EVENT_TYPES.values())]


def _as_postgres_renders_it(data: str) -> str:
    """jsonb text: keys reordered (shorter first), ', ' and ': ' separators."""
    obj = json.loads(data)
    return json.dumps(dict(sorted(obj.items(), key=lambda kv: (len(kv[0]), kv[0]))), ensure_ascii=False)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_fast_path_equals_validation_for_every_event_type(event: Any) -> None:
    rec = ev.encode(event, "k")
    for data in (rec.data, _as_postgres_renders_it(rec.data)):
        fast = ev._fast_decode(rec.type, rec.version, data)
        assert fast is not None, "a row encode wrote must take the fast path"
        validated = ev.decode(rec.type, rec.version, data, validate=True)
        assert type(fast) is type(validated) is type(event)
        assert fast == validated == event
        assert fast.model_dump() == event.model_dump()
        assert fast.at.utcoffset() == timedelta(0)
    [many] = ev.decode_many([(rec.type, rec.version, rec.data)])
    assert many == event and type(many) is type(event)


def test_decode_many_mixes_paths_in_order() -> None:
    rows = [(r.type, r.version, r.data) for r in (ev.encode(e, "k") for e in EXAMPLES)]
    partial = json.loads(rows[0][2])
    partial.pop("source")  # a row missing a defaulted field: valid, but not encode's shape
    rows.insert(1, (rows[0][0], rows[0][1], json.dumps(partial)))
    decoded = ev.decode_many(rows)
    assert decoded == ev.decode_many(rows, validate=True)
    assert decoded[1].source == "lastActiveTime"  # the default is filled
    assert [type(e) for e in decoded] == [type(EXAMPLES[0])] + [type(e) for e in EXAMPLES]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: {**d, "unexpected": 1},  # extra key: forbidden
        lambda d: {**d, "at": "2026-01-01T00:00:00"},  # naive time
        lambda d: {**d, "at": "not a time"},
        lambda d: {**d, "count": 0},  # below the field's bound (ge=1)
        lambda d: {**d, "count": "many"},
        lambda d: {**d, "model": None},
        lambda d: {**d, "type": "GamingIntentEnded"},  # the row's type column says otherwise
        lambda d: {k: v for k, v in d.items() if k != "namespace"},  # a required field missing
    ],
)
def test_invalid_rows_fall_back_to_validation_and_raise(change: Any) -> None:
    rec = ev.encode(ev.ForegroundRequest(at=T0, namespace="ns", model="m"), "k")
    data = json.dumps(change(json.loads(rec.data)))
    assert ev._fast_decode(rec.type, rec.version, data) is None
    with pytest.raises(ev.EventDecodeError):
        ev.decode_many([(rec.type, rec.version, data)])
    with pytest.raises(ev.EventDecodeError):
        ev.decode(rec.type, rec.version, data)


def test_every_event_type_has_a_compiled_decoder() -> None:
    # A field type the mirror cannot express would silently send that type to pydantic.
    assert set(ev._FAST) == set(ev.EVENT_TYPES)


def test_a_lax_value_pydantic_accepts_still_decodes() -> None:
    rec = ev.encode(ev.ForegroundRequest(at=T0, namespace="ns", model="m", count=2), "k")
    data = json.dumps({**json.loads(rec.data), "count": "2"})  # msgspec is strict, pydantic coerces
    assert ev._fast_decode(rec.type, rec.version, data) is None
    assert ev.decode(rec.type, rec.version, data).count == 2


def test_unknown_type_and_future_version_raise() -> None:
    with pytest.raises(ev.EventDecodeError, match="unknown event type"):
        ev.decode_many([("NoSuchEvent", 1, "{}")])
    rec = ev.encode(EXAMPLES[0], "k")
    with pytest.raises(ev.EventDecodeError, match="newer than this code"):
        ev.decode(rec.type, rec.version + 1, rec.data)


def test_older_version_is_upcast_then_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = ev.encode(ev.ForegroundRequest(at=T0, namespace="ns", model="m", count=3), "k")
    old = json.loads(rec.data)
    old["n"] = old.pop("count")  # pretend v0 called it "n"
    monkeypatch.setitem(ev.UPCASTERS, ("ForegroundRequest", 0), lambda p: {**{k: v for k, v in p.items() if k != "n"}, "count": p["n"]})
    [e] = ev.decode_many([(rec.type, 0, json.dumps(old))])
    assert e.count == 3 and e == ev.ForegroundRequest(at=T0, namespace="ns", model="m", count=3)


def _foreground_examples() -> list[Any]:
    return [
        ev.ForegroundRequest(at=T0, namespace="ns", model="m"),
        ev.ForegroundRequest(at=T0, namespace="ns", model="m-é", source="trace", count=7, busy_until=T0 + timedelta(seconds=90)),
    ]


def test_lean_decode_gives_every_mirrored_event_in_its_compiled_form() -> None:
    # decode_rows(lean=True), the fold-only path of start-up and catch-up: a row of a class with
    # a mirror is its checked msgspec row, every attribute equal to the pydantic event's (the
    # event's own model_dump, not the decoder's output, is the reference); others as before
    events = _foreground_examples() + [e for e in EXAMPLES if type(e) is not ev.ForegroundRequest]
    rows = [(i, r.type, r.version, _as_postgres_renders_it(r.data)) for i, r in enumerate((ev.encode(e, "k") for e in events), 1)]
    lean, full = ev.decode_rows(rows, lean=True), ev.decode_rows(rows)
    assert [p for p, _ in lean] == [p for p, _ in full] == list(range(1, len(events) + 1))
    compiled = 0
    for (_, got), (_, want), event in zip(lean, full, events):
        assert want == event
        if type(got) in ev.COMPILED:
            compiled += 1
            assert ev.COMPILED[type(got)] is type(event)
            assert type(got) in ev.with_compiled(type(event)) and type(event) in ev.with_compiled(type(event))
            assert {name: getattr(got, name) for name in type(event).model_fields} == event.model_dump()
        else:
            assert type(got) is type(event) and got == event
    assert type(lean[0][1]) is ev.ForegroundRequestRow
    # every class of EXAMPLES whose fields msgspec can mirror (today all of them) came compiled
    assert compiled == sum(1 for e in events if ev._mirror(type(e)) is not None) and compiled > len(events) // 2


def test_lean_decode_sends_what_the_compiled_form_refuses_through_pydantic() -> None:
    good = ev.encode(_foreground_examples()[1], "k")
    lax = json.loads(good.data) | {"count": "7"}  # a lax value pydantic coerces, msgspec refuses
    got = ev.decode_rows([(1, good.type, good.version, json.dumps(lax))], lean=True)
    assert type(got[0][1]) is ev.ForegroundRequest and got[0][1].count == 7
    bad = json.loads(good.data) | {"count": 0}  # below its bound: refused by both
    with pytest.raises(ev.EventDecodeError):
        ev.decode_rows([(1, good.type, good.version, json.dumps(bad))], lean=True)
    with pytest.raises(ev.EventDecodeError, match="newer than this code"):  # the version is checked first
        ev.decode_rows([(1, good.type, good.version + 1, good.data)], lean=True)


@pytest.mark.parametrize("lean", [False, True])
def test_a_row_without_its_type_key_is_refused_on_every_path(lean: bool) -> None:
    # an adversarial trial: the compiled path filled the missing ``type`` with its default and
    # accepted the row that pydantic (whose discriminator is ``type``) refuses
    rec = ev.encode(_foreground_examples()[0], "k")
    data = json.loads(rec.data)
    del data["type"]
    with pytest.raises(ev.EventDecodeError):
        ev.decode(rec.type, rec.version, json.dumps(data))
    with pytest.raises(ev.EventDecodeError):
        ev.decode_rows([(1, rec.type, rec.version, json.dumps(data))], lean=lean)


def test_an_undecodable_row_is_one_line_naming_its_position_and_field() -> None:
    """A day-2 trial: a row with an extra field gave a four-line error (pydantic's, a link
    included) and no position, in ``db restore``, ``replay`` and the controller's log."""
    good = json.loads(ev.encode(ev.ModelReady(at=T0, namespace="n", model="m", node="x"), "k").data)
    bad = json.dumps({**good, "x": 1})
    with pytest.raises(ev.EventDecodeError) as info:
        ev.decode_rows([(16, "ModelReady", ev.ModelReady.version, json.dumps(good)), (17, "ModelReady", ev.ModelReady.version, bad)])
    message = str(info.value)
    assert "\n" not in message and info.value.position == 17
    assert message == f"position 17: invalid ModelReady v{ev.ModelReady.version}: ModelReady.x: Extra inputs are not permitted"
    with pytest.raises(ev.EventDecodeError) as info:  # not a stored row's: no position
        ev.decode_many([("ModelReady", ev.ModelReady.version, bad)])
    assert info.value.position is None and str(info.value).startswith("invalid ModelReady")
