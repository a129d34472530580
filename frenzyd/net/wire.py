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
"""Ceiling on one frame of any kind (bytes); each kind has its own, smaller cap (``kind_cap``)."""
DEFAULT_KIND_MAX: Final = 64 * 1024
"""Cap on one frame of a kind registered without ``max_bytes`` (bytes)."""
CONTAINERS_PER_BYTE: Final = 1 / 16
"""A kind's frame may hold at most ``max(256, cap / 16)`` maps and arrays: each costs ~60-230 bytes
decoded while taking one byte on the wire, so this keeps a frame's decoded size near its cap."""
MAX_KIND_NAME: Final = 64

SIGNED_KIND: Final = "signed"

REJECT_REASONS: Final = (
    "oversized",  # more bytes than max_bytes or the kind's cap (checked before unpacking the body)
    "malformed",  # not valid msgpack, trailing bytes, ext types, too deeply nested, too many containers
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
CAPS: dict[str, int] = {}
"""kind -> the largest frame of that kind a node accepts (bytes), set at registration."""


def register_kind(
    name: str, schema: Schema | Mapping[str, FieldType], *, max_bytes: int = DEFAULT_KIND_MAX
) -> None:
    """Register message kind ``name``.  A plain mapping means "all these keys are required".

    ``max_bytes`` caps one frame of this kind: the size of its largest legitimate body plus
    overhead (checked before the body is unpacked).  Re-registering a kind with an identical schema
    is a no-op (its cap becomes the larger of the two); a different schema raises ``ValueError``
    (two modules disagreeing on a message is a bug).
    """
    if not name or len(name) > MAX_KIND_NAME:
        raise ValueError(f"message kind name must be 1..{MAX_KIND_NAME} characters, got {name!r}")
    if not 0 < max_bytes <= DEFAULT_MAX:
        raise ValueError(f"max_bytes of {name!r} must be in 1..{DEFAULT_MAX}, got {max_bytes}")
    sch = schema if isinstance(schema, Schema) else Schema(required=dict(schema))
    old = KINDS.get(name)
    if old is not None and old != sch:
        raise ValueError(f"message kind {name!r} is already registered with a different schema")
    KINDS[name] = sch
    CAPS[name] = max(max_bytes, CAPS.get(name, 0))


def kind_cap(kind: str, caps: Mapping[str, int] | None = None) -> int:
    """The frame cap of ``kind``: ``caps[kind]`` (a configured override) or its registered cap."""
    if caps is not None and kind in caps:
        return caps[kind]
    return CAPS.get(kind, DEFAULT_KIND_MAX)


def largest_cap(caps: Mapping[str, int] | None = None) -> int:
    """The largest frame any registered kind accepts (what a server must be willing to read)."""
    return max([DEFAULT_KIND_MAX, *(kind_cap(k, caps) for k in KINDS)])


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


def packed_size(value: Any) -> int:
    """The bytes ``value`` takes inside a frame (for filling a page up to its kind's cap)."""
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode {type(value).__name__}: {exc}") from exc


def _no_ext(code: int, data: bytes) -> object:
    raise FrameRejected("malformed", f"msgpack extension type {code} is not allowed")


class _ContainerBudget:
    """Counts the maps and arrays msgpack builds; past the budget it stops the unpacker."""

    __slots__ = ("left",)

    def __init__(self, budget: int) -> None:
        self.left = budget

    def _spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise FrameRejected("malformed", "too many maps and arrays for the frame's kind")

    def on_map(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._spend()
        return obj

    def on_list(self, obj: list[Any]) -> list[Any]:
        self._spend()
        return obj


_HEADER_BYTES = 16 + MAX_KIND_NAME
"""The frame header ``{"v": int, "k": str, "b":`` fits in this many bytes."""


def _header(data: bytes) -> tuple[int, str, int] | None:
    """Read ``{"v": version, "k": kind, "b": ...`` from the first bytes only; return the version,
    the kind and the offset of the body, or None when the frame does not start that way (the
    encoder always writes these keys in this order).  Raises the ``version`` rejection."""
    up = msgpack.Unpacker(raw=False, max_buffer_size=_HEADER_BYTES, max_str_len=MAX_KIND_NAME,
                          max_bin_len=0, max_array_len=0, max_map_len=3, max_ext_len=0, ext_hook=_no_ext)
    up.feed(data[:_HEADER_BYTES])
    try:
        if up.read_map_header() != 3 or up.unpack() != "v":
            return None
        version = up.unpack()
        if up.unpack() != "k":
            return None
        kind = up.unpack()
        if up.unpack() != "b":
            return None
    except FrameRejected:
        raise
    except (msgpack.OutOfData, msgpack.FormatError, msgpack.StackError, ValueError, UnicodeDecodeError,
            TypeError):
        return None
    if not isinstance(version, int) or isinstance(version, bool) or not isinstance(kind, str):
        return None
    if version != PROTOCOL_VERSION:
        raise FrameRejected("version", f"protocol version {version}, this node speaks {PROTOCOL_VERSION}",
                            version=version)
    return version, kind, up.tell()


def _classify(data: bytes, max_bytes: int) -> FrameRejected:
    """Why a frame without a well-formed header is refused: ``malformed`` (not msgpack) or
    ``not_a_frame`` (msgpack of another shape).  Decodes under a small container budget."""
    budget = _ContainerBudget(256)
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_no_ext,
                              object_hook=budget.on_map, list_hook=budget.on_list, max_bin_len=max_bytes,
                              max_str_len=max_bytes, max_array_len=max_bytes, max_map_len=max_bytes,
                              max_ext_len=0)
    except FrameRejected as exc:
        return exc
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        return FrameRejected("malformed", type(exc).__name__)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return FrameRejected("malformed", f"{type(exc).__name__}: {str(exc)[:80]}")
    if isinstance(obj, dict) and set(obj) == {"v", "k", "b"}:
        if not isinstance(obj["v"], int) or isinstance(obj["v"], bool):
            return FrameRejected("not_a_frame", "version is not an integer")
        if not isinstance(obj["k"], str):
            return FrameRejected("not_a_frame", "kind is not a string")
        return FrameRejected("not_a_frame", "keys v, k, b out of order or kind name too long")
    return FrameRejected("not_a_frame", "expected a map with keys v, k, b")


def decode(data: bytes, *, max_bytes: int = DEFAULT_MAX, caps: Mapping[str, int] | None = None) -> Message:
    """Decode and validate one frame; raise :class:`FrameRejected` with a reason on any fault.

    In this order, before the body is unpacked: the whole frame against ``max_bytes``; the header
    (``v``, ``k``, ``b`` in that order, the version, a registered kind, read from the first bytes
    alone); the frame against the kind's cap (``caps`` overrides the registered caps).  The body is
    then unpacked with msgpack's per-object limits set to that cap and a budget of maps and arrays
    (``CONTAINERS_PER_BYTE``), so a small frame cannot expand into a large allocation.
    """
    if len(data) > max_bytes:
        raise FrameRejected("oversized", f"{len(data)} bytes > cap {max_bytes}")
    header = _header(data)
    if header is None:
        raise _classify(data, max_bytes)
    version, kind, offset = header
    if kind not in KINDS:
        raise FrameRejected("unknown_kind", f"no message kind {kind[:64]!r} is registered")
    cap = min(max_bytes, kind_cap(kind, caps))
    if len(data) > cap:
        raise FrameRejected("oversized", f"{kind} frame of {len(data)} bytes > its cap {cap}")
    budget = _ContainerBudget(max(256, int(cap * CONTAINERS_PER_BYTE)))
    try:
        body = msgpack.unpackb(
            memoryview(data)[offset:],
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_no_ext,
            object_hook=budget.on_map,
            list_hook=budget.on_list,
            max_bin_len=cap,
            max_str_len=cap,
            max_array_len=cap,
            max_map_len=cap,
            max_ext_len=0,
        )
    except FrameRejected:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameRejected("malformed", type(exc).__name__) from exc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # Truncated input, invalid UTF-8, non-str/bytes map keys, limits exceeded.
        raise FrameRejected("malformed", f"{type(exc).__name__}: {str(exc)[:80]}") from exc
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


def message(
    kind: str, schema: Schema | Mapping[str, FieldType], *, max_bytes: int = DEFAULT_KIND_MAX
) -> Callable[[_B], _B]:
    """Class decorator: register ``kind`` with ``schema`` and its frame cap, and the class as its
    typed form."""
    def deco(cls: _B) -> _B:
        register_kind(kind, schema, max_bytes=max_bytes)
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

HEARTBEAT_MAX: Final = 1024 * 1024
"""Cap on a heartbeat frame (its report lists at most 100 unfinished and 20 finished jobs)."""

register_kind(
    "heartbeat",
    Schema(
        required={"node_id": str, "name": str, "address": str, "priority": int, "term": int},
        optional={"coordinator": (str, type(None)), "report": dict},
    ),
    max_bytes=HEARTBEAT_MAX,
)
"""Sent every ``timing.heartbeat_s`` and answered with the receiver's own heartbeat."""

register_kind("ok", Schema(optional={"detail": str}))
"""A generic acknowledgement."""

register_kind("error", Schema(required={"reason": str}, optional={"detail": str}))
"""A refusal: ``reason`` is machine-readable (e.g. ``unknown_kind``, ``stale_term``)."""
