"""The peer wire codec: msgpack frames with a version, a kind and a schema-checked body (pure).

A frame is the msgpack map ``{"v": PROTOCOL_VERSION, "k": kind, "b": body}``.  Every
kind is registered in ``KINDS`` with a :class:`Schema` (required and optional keys with
their types); :func:`decode` checks the size cap *before* unpacking, then the frame
shape, the version, the kind and the body's schema, and raises :class:`FrameRejected`
(a :class:`~frenzyd.errors.WireError`) whose ``reason`` is one of ``REJECT_REASONS`` so
a receive loop can count drops by reason.  This is the only module that imports msgpack.

Orders that start or stop processes travel inside a ``signed`` envelope (kind
``SIGNED_KIND``): the exact bytes of the inner frame, the signer's certificate and an
Ed25519 signature over those bytes (see ``frenzyd.net.auth.seal_order``/``open_order``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Self, TypeVar

import msgpack

from frenzyd.errors import WireError

PROTOCOL_VERSION: Final = 2
"""1: the first daemon.  2: attempts -- every job order, lease, report, output and result carries
``(job_id, attempt)``, records carry ``schema`` (frenzyd.jobs.model.RECORD_SCHEMA), ``job.attempt``."""
DEFAULT_MAX: Final = 4 * 1024 * 1024
"""Default cap on one frame (bytes).  Payload-carrying kinds pass a larger ``max_bytes``."""

SIGNED_KIND: Final = "signed"

REJECT_REASONS: Final = (
    "oversized",  # more bytes than max_bytes (checked before unpacking)
    "malformed",  # not valid msgpack, trailing bytes, ext types, too deeply nested
    "not_a_frame",  # valid msgpack but not a {"v", "k", "b"} map
    "version",  # a protocol version this node does not speak
    "unknown_kind",  # a kind nobody registered
    "schema",  # the body lacks a required key or a value has the wrong type
)

# A value type in a schema: one Python type or a tuple of them.  ``int`` never
# matches a bool (msgpack keeps them apart, and so do we); ``float`` accepts ints.
FieldType = type | tuple[type, ...]


class FrameRejected(WireError):
    """A frame was dropped; ``reason`` is one of ``REJECT_REASONS``, ``detail`` says why."""

    def __init__(self, reason: str, detail: str = "", *, version: int | None = None) -> None:
        msg = f"wire frame rejected ({reason})"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.reason = reason
        self.detail = detail
        self.version = version
        """For ``reason == "version"``: the protocol version the frame was written in."""


@dataclass(frozen=True)
class Schema:
    """Keys a body of one kind must (``required``) or may (``optional``) carry, with their types.

    Keys not named are allowed and kept (newer peers may add fields), so that
    adding an optional field never breaks an older receiver.
    """

    required: Mapping[str, FieldType] = field(default_factory=dict)
    optional: Mapping[str, FieldType] = field(default_factory=dict)


@dataclass(frozen=True)
class Message:
    """A decoded, validated frame."""

    version: int
    kind: str
    body: dict[str, Any]


KINDS: dict[str, Schema] = {}
"""The registry of message kinds; use :func:`register_kind` to add one."""


def register_kind(name: str, schema: Schema | Mapping[str, FieldType]) -> None:
    """Register message kind ``name``.  A plain mapping means "all these keys are required".

    Re-registering a kind with an identical schema is a no-op; a different schema
    raises ``ValueError`` (two modules disagreeing on a message is a bug).
    """
    if not name or len(name) > 64:
        raise ValueError(f"message kind name must be 1..64 characters, got {name!r}")
    sch = schema if isinstance(schema, Schema) else Schema(required=dict(schema))
    old = KINDS.get(name)
    if old is not None and old != sch:
        raise ValueError(f"message kind {name!r} is already registered with a different schema")
    KINDS[name] = sch


def _type_ok(value: object, expected: FieldType) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    for t in types:
        if t is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t is float:
            if isinstance(value, float | int) and not isinstance(value, bool):
                return True
        elif t is type(None):
            if value is None:
                return True
        elif isinstance(value, t):
            return True
    return False


def check_body(kind: str, body: Mapping[str, Any]) -> None:
    """Raise :class:`FrameRejected` (``schema``/``unknown_kind``) unless ``body`` fits ``kind``."""
    schema = KINDS.get(kind)
    if schema is None:
        raise FrameRejected("unknown_kind", f"no message kind {kind[:64]!r} is registered")
    for key, expected in schema.required.items():
        if key not in body:
            raise FrameRejected("schema", f"{kind}: missing key {key!r}")
        if not _type_ok(body[key], expected):
            raise FrameRejected("schema", f"{kind}.{key}: wrong type {type(body[key]).__name__}")
    for key, expected in schema.optional.items():
        if key in body and not _type_ok(body[key], expected):
            raise FrameRejected("schema", f"{kind}.{key}: wrong type {type(body[key]).__name__}")


def encode(kind: str, body: Mapping[str, Any]) -> bytes:
    """Encode one frame.  The body is checked against the kind's schema first.

    Raises :class:`FrameRejected` for an unregistered kind or a body that does not
    fit its schema (the sender's bug, caught before the bytes leave), and
    ``WireError`` for values msgpack cannot carry.
    """
    check_body(kind, body)
    try:
        data: bytes = msgpack.packb({"v": PROTOCOL_VERSION, "k": kind, "b": dict(body)}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode {kind!r} message: {exc}") from exc
    return data


def _no_ext(code: int, data: bytes) -> object:
    raise FrameRejected("malformed", f"msgpack extension type {code} is not allowed")


def decode(data: bytes, *, max_bytes: int = DEFAULT_MAX) -> Message:
    """Decode and validate one frame; raise :class:`FrameRejected` with a reason on any fault.

    The size cap is checked before anything is unpacked, and msgpack's own
    per-object limits are set to ``max_bytes`` so no length field inside the frame
    can make the unpacker allocate more than the frame itself.
    """
    if len(data) > max_bytes:
        raise FrameRejected("oversized", f"{len(data)} bytes > cap {max_bytes}")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_no_ext,
            max_bin_len=max_bytes,
            max_str_len=max_bytes,
            max_array_len=max_bytes,
            max_map_len=max_bytes,
            max_ext_len=0,
        )
    except FrameRejected:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameRejected("malformed", type(exc).__name__) from exc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # Truncated input, invalid UTF-8, non-str/bytes map keys, limits exceeded.
        raise FrameRejected("malformed", f"{type(exc).__name__}: {str(exc)[:80]}") from exc
    if not isinstance(obj, dict) or set(obj) != {"v", "k", "b"}:
        raise FrameRejected("not_a_frame", "expected a map with keys v, k, b")
    version, kind, body = obj["v"], obj["k"], obj["b"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise FrameRejected("not_a_frame", "version is not an integer")
    if version != PROTOCOL_VERSION:
        raise FrameRejected("version", f"protocol version {version}, this node speaks {PROTOCOL_VERSION}",
                            version=version)
    if not isinstance(kind, str):
        raise FrameRejected("not_a_frame", "kind is not a string")
    if not isinstance(body, dict):
        raise FrameRejected("not_a_frame", "body is not a map")
    check_body(kind, body)
    return Message(version=version, kind=kind, body=body)


# --- typed messages ------------------------------------------------------------------------


class Body(ABC):
    """Base of the typed message classes: one frozen dataclass per kind (``KIND``).

    A subclass turns itself into a body (``to_body``, keys in the order they go on the wire) and
    is built from a schema-checked body (``from_body``, raising :class:`FrameRejected` with reason
    ``schema`` for what the schema cannot say).  Register it with :func:`message`.
    """

    KIND: ClassVar[str] = ""

    @abstractmethod
    def to_body(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self: ...


TYPES: dict[str, type[Body]] = {}
"""kind -> its typed class, for :func:`parse`."""

_B = TypeVar("_B", bound=type[Body])


def message(kind: str, schema: Schema | Mapping[str, FieldType]) -> Callable[[_B], _B]:
    """Class decorator: register ``kind`` with ``schema`` and the class as its typed form."""
    def deco(cls: _B) -> _B:
        register_kind(kind, schema)
        cls.KIND = kind
        TYPES[kind] = cls
        return cls
    return deco


def encode_message(msg: Body) -> bytes:
    """Encode one typed message (its kind's schema is checked as by :func:`encode`)."""
    return encode(msg.KIND, msg.to_body())


def parse(msg: Message) -> Body | dict[str, Any]:
    """The typed form of a decoded frame; a kind with no typed class gives its body as is.

    Raises :class:`FrameRejected` (``schema``) when the body passes the schema but not the class's
    own checks (a malformed job record, say): the frame is dropped at the edge, counted by reason.
    """
    cls = TYPES.get(msg.kind)
    if cls is None:
        return msg.body
    try:
        return cls.from_body(msg.body)
    except FrameRejected:
        raise
    except WireError as exc:
        raise FrameRejected("schema", f"{msg.kind}: {exc}") from None


# --- kinds owned by the mechanisms layer -------------------------------------------------

register_kind(
    SIGNED_KIND,
    Schema(required={"frame": bytes, "cert": bytes, "sig": bytes}),
)
"""A signed order: ``frame`` = exact bytes of an inner frame, ``sig`` = Ed25519 over them."""

register_kind(
    "heartbeat",
    Schema(
        required={"node_id": str, "name": str, "address": str, "priority": int, "term": int},
        optional={"coordinator": (str, type(None)), "report": dict},
    ),
)
"""Sent every ``timing.heartbeat_s`` and answered with the receiver's own heartbeat."""

register_kind("ok", Schema(optional={"detail": str}))
"""A generic acknowledgement."""

register_kind("error", Schema(required={"reason": str}, optional={"detail": str}))
"""A refusal: ``reason`` is machine-readable (e.g. ``unknown_kind``, ``stale_term``)."""
