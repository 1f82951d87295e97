"""The log stores no NUL character (backfill.core.storable): encode replaces it by U+FFFD, and
content copied into a Job that held one is Blocked, not changed silently."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from backfill.controller.translate import Translator
from backfill.core import events as ev
from backfill.core.projector import fold
from backfill.core.state import World
from backfill.core.storable import nul_path, without_nul

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)


def test_encode_replaces_every_nul_and_the_record_decodes_to_the_replacement_character():
    e = ev.GamingIntentStarted(at=NOW, namespace="n", session="g\x00", node="node-a\x00")
    r = ev.encode(e, "gaming/u/1\x00")
    assert "\x00" not in r.data and "\\u0000" not in r.data and "\x00" not in r.idempotency_key
    assert (r.idempotency_key, r.stream) == ("gaming/u/1\ufffd", "gamingsession/n/g\ufffd")
    back = ev.decode(r.type, r.version, r.data)
    assert back == e.model_copy(update={"node": "node-a\ufffd", "session": "g\ufffd"})


def test_a_backslash_before_u0000_is_text_not_a_nul_and_is_kept():
    # JSON writes this string as ...\\u0000...: the cheap substring test sees "\u0000", the
    # exact path finds no NUL and the text survives unchanged.
    e = ev.GamingIntentStarted(at=NOW, namespace="n", session="g", node="a\\u0000b")
    r = ev.encode(e, "k")
    assert ev.decode(r.type, r.version, r.data).node == "a\\u0000b"
    assert json.loads(r.data)["node"] == "a\\u0000b"


def test_an_event_without_a_nul_is_stored_as_before_the_field_existed():
    """``unstorable`` is left out when empty: rows of BackfillApplied and CronJobSeen read as
    they did before it existed (a previous release, a standby being rolled, still decodes them)."""
    e = ev.BackfillApplied(at=NOW, namespace="n", name="b", uid="u", generation=1, spec={"modelRef": "m"})
    c = ev.CronJobSeen(at=NOW, namespace="n", name="t", job_template={"spec": {}})
    for x in (e, c):
        assert "unstorable" not in json.loads(ev.encode(x, "k").data)
        assert ev.decode(x.type, x.version, ev.encode(x, "k").data) == x


def test_an_unchanged_template_keeps_its_position_and_a_nul_change_does_not():
    tr = Translator()
    meta = {"namespace": "n", "name": "t", "uid": "u", "resourceVersion": "1"}
    good = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "args": ["x\ufffd"]}]}}}}
    nul = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "args": ["x\x00"]}]}}}}
    w = World()
    for pos, template in enumerate([good, good, nul, nul, good], 1):
        (e, _), = tr.cronjob("MODIFIED", {"metadata": {**meta, "resourceVersion": str(pos)}, "spec": {"jobTemplate": template}}, NOW)
        w = fold(w, e, pos)
        t = w.templates[("n", "t")]
        # the NUL version's stored template equals the literal-U+FFFD one: only unstorable differs
        assert (t.pos, t.problem is not None) == {1: (1, False), 2: (1, False), 3: (3, True), 4: (3, True), 5: (5, False)}[pos]


def test_nul_path_names_the_first_key_or_string_holding_one():
    assert nul_path({"a": [1, "x", {"b\x00": 2}]}, "spec") == "spec.a[2].b\x00"
    assert nul_path({"a": ["ok", "n\x00"]}, "spec") == "spec.a[1]"
    assert nul_path({"a": ["ok", 3, None, True]}, "spec") == ""
    assert without_nul({"k\x00": ["v\x00", 1]}) == {"k\ufffd": ["v\ufffd", 1]}


def test_a_spec_or_template_with_a_nul_is_blocked_with_its_path():
    tr = Translator()
    meta = {"namespace": "n", "name": "b", "uid": "u", "resourceVersion": "1", "generation": 1}
    spec = {"modelRef": "m", "templateRef": "t", "env": {"X": "a\x00b"}}
    pairs = tr.backfill("ADDED", {"metadata": meta, "spec": spec}, NOW)
    pairs += tr.cronjob("ADDED", {"metadata": {**meta, "name": "t"}, "spec": {"jobTemplate": {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "i", "args": ["ok", "x\x00"]}]}}}}}}, NOW)  # fmt: skip
    w = World()
    for i, (e, _) in enumerate(pairs, 1):
        assert "\x00" not in e.model_dump_json(), "an event with a NUL would be refused by the log"
        w = fold(w, e, i)
    b = w.backfills[("n", "b")]
    assert (b.problem.reason, b.spec) == ("InvalidSpec", None)
    assert b.problem.message.startswith("spec.env.X contains a NUL character (U+0000)")
    t = w.templates[("n", "t")]
    assert t.problem[0] == "InvalidTemplate"
    assert t.problem[1].startswith("CronJob t: spec.jobTemplate.spec.template.spec.containers[0].args[1] contains a NUL")
    # the same spec without the NUL is a valid declaration (the block is the NUL's)
    fixed = tr.backfill("MODIFIED", {"metadata": {**meta, "generation": 2}, "spec": {**spec, "env": {"X": "ab"}}}, NOW)
    w = fold(w, fixed[0][0], 9)
    assert w.backfills[("n", "b")].problem is None
