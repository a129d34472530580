"""The wire codec: round trips, and every kind of bad frame rejected with its reason, never a crash."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import WireError
from frenzyd.net import wire
from frenzyd.net.wire import FrameRejected, Schema

V = wire.PROTOCOL_VERSION

HB = {"node_id": "ab" * 16, "name": "ws-01", "address": "10.0.0.1:7470", "priority": 0, "term": 3}


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_round_trip_keeps_kind_body_and_version() -> None:
    body = dict(HB, coordinator=None, report={"gpus": [{"uuid": "GPU-1", "free": 2**40}]})
    msg = wire.decode(wire.encode("heartbeat", body))
    assert msg == wire.Message(version=wire.PROTOCOL_VERSION, kind="heartbeat", body=body)


def test_unknown_extra_keys_survive_for_forward_compatibility() -> None:
    msg = wire.decode(wire.encode("heartbeat", dict(HB, new_field=[1, 2])))
    assert msg.body["new_field"] == [1, 2]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),  # a msgpack byte that is never valid
        (b"\xdb\xff\xff\xff\xff", "malformed"),  # str32 claiming 4 GiB, truncated
        (_raw({"v": V, "k": "ok", "b": {}}) + b"\x00", "malformed"),  # trailing bytes
        (b"\x91" * 100_000, "malformed"),  # nested too deep
        (_raw([1, "ok", {}]), "not_a_frame"),
        (_raw({"v": V, "k": "ok"}), "not_a_frame"),
        (_raw({"v": "1", "k": "ok", "b": {}}), "not_a_frame"),
        (_raw({"v": True, "k": "ok", "b": {}}), "not_a_frame"),
        (_raw({"v": V, "k": 7, "b": {}}), "not_a_frame"),
        (_raw({"v": V, "k": "ok", "b": [1]}), "not_a_frame"),
        (_raw({"v": V + 1, "k": "ok", "b": {}}), "version"),
        (_raw({"v": 0, "k": "ok", "b": {}}), "version"),
        (_raw({"v": V, "k": "no-such-kind", "b": {}}), "unknown_kind"),
        (_raw({"v": V, "k": "heartbeat", "b": {k: v for k, v in HB.items() if k != "term"}}), "schema"),
        (_raw({"v": V, "k": "heartbeat", "b": dict(HB, term="3")}), "schema"),
        (_raw({"v": V, "k": "heartbeat", "b": dict(HB, priority=True)}), "schema"),
        (_raw({"v": V, "k": "heartbeat", "b": dict(HB, coordinator=5)}), "schema"),
        (_raw({"v": V, "k": "signed", "b": {"frame": "text", "cert": b"", "sig": b""}}), "schema"),
        (msgpack.packb({"v": V, "k": "ok", "b": {"x": msgpack.ExtType(5, b"x")}}), "malformed"),
        (b"\x81\xa2\xff\xfe\x01", "malformed"),  # invalid UTF-8 in a key
    ],
)
def test_bad_frames_are_rejected_with_their_reason(data: bytes, reason: str) -> None:
    with pytest.raises(FrameRejected) as info:
        wire.decode(data)
    assert info.value.reason == reason
    assert reason in wire.REJECT_REASONS
    assert isinstance(info.value, WireError)


def test_size_cap_is_checked_before_unpacking() -> None:
    frame = wire.encode("ok", {"detail": "x" * 1000})
    assert wire.decode(frame, max_bytes=len(frame)).body["detail"] == "x" * 1000
    with pytest.raises(FrameRejected) as info:
        wire.decode(frame, max_bytes=len(frame) - 1)
    assert info.value.reason == "oversized"


def test_inner_length_fields_cannot_exceed_the_cap() -> None:
    # A 9-byte bin32 header claiming 100 MB with a small body: rejected, not allocated.
    # (Written in the current protocol version: the version is refused before the body is read.)
    data = b"\x83\xa1v" + bytes([V]) + b"\xa1k\xa2ok\xa1b\x81\xa1x\xc6\x05\xf5\xe1\x00" + b"\x00" * 10
    with pytest.raises(FrameRejected) as info:
        wire.decode(data, max_bytes=1000)
    assert info.value.reason == "malformed"


def test_encode_checks_the_schema_before_sending() -> None:
    with pytest.raises(FrameRejected) as info:
        wire.encode("heartbeat", {"node_id": "x"})
    assert info.value.reason == "schema"
    with pytest.raises(FrameRejected):
        wire.encode("never-registered", {})
    with pytest.raises(WireError):
        wire.encode("ok", {"detail": "x", "obj": object()})


def test_register_kind_is_idempotent_but_refuses_conflicts() -> None:
    wire.register_kind("test.kind", {"a": int})
    wire.register_kind("test.kind", Schema(required={"a": int}))
    with pytest.raises(ValueError, match="different schema"):
        wire.register_kind("test.kind", {"a": str})
    assert wire.decode(wire.encode("test.kind", {"a": 1})).body == {"a": 1}
    with pytest.raises(FrameRejected):
        wire.encode("test.kind", {"a": 1.5})
    wire.register_kind("test.float", {"x": float})
    assert wire.decode(wire.encode("test.float", {"x": 2})).body == {"x": 2}


def _decode_or_reject(data: bytes, max_bytes: int = wire.DEFAULT_MAX) -> None:
    reason = "accepted"
    try:
        wire.decode(data, max_bytes=max_bytes)
    except FrameRejected as exc:
        reason = exc.reason
    assert reason == "accepted" or reason in wire.REJECT_REASONS


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_raise_anything_but_frame_rejected(data: bytes) -> None:
    _decode_or_reject(data, max_bytes=256)


def _containers(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # A named function, not a lambda: hypothesis describes a lambda by parsing the test's source with
    # ast, and CPython 3.11.7's ast.parse can raise "SystemError: AST constructor recursion depth
    # mismatch" when called deep in a recursive draw (a CI run failed this test that way, not the codec).
    return st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    _containers,
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "k", "b", "x"]), _values, max_size=4))
def test_random_structures_never_raise_anything_but_frame_rejected(obj: dict[str, Any]) -> None:
    _decode_or_reject(_raw(obj))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), _values, max_size=6))
def test_any_ok_body_round_trips(extra: dict[str, Any]) -> None:
    body = {k: v for k, v in extra.items() if k != "detail"}
    msg = wire.decode(wire.encode("ok", body))
    assert msg.kind == "ok"
    assert msg.body.keys() == body.keys()
