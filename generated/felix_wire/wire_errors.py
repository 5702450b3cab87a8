# Generated from spec/messages.yaml and spec/features.yaml by codegen - DO NOT EDIT.
# spec sha256: 1ef184e31ee09203b3e39b05d12c995a255a5bc51535f2c9de105be7415f9e8c
"""Local wire errors: bytes we could not parse, or values we could not lay out.

These are *local* protocol errors, kept apart from the broker's *remote* errors
(errors.BrokerError). Every decode error names what was being decoded (a layout
or message type), the field, and the byte offset inside the payload where the
problem was found, so a bad frame can be located without a debugger.
"""

from __future__ import annotations

__all__ = [
    "WireError",
    "FrameError",
    "BadMagicError",
    "UnsupportedVersionError",
    "FrameTooLargeError",
    "TruncatedFrameError",
    "FlagError",
    "UnknownFlagsError",
    "IllegalFlagCombinationError",
    "PayloadDecodeError",
    "TruncatedPayloadError",
    "TrailingBytesError",
    "LengthOutOfRangeError",
    "InvalidUtf8Error",
    "InvalidEnumValueError",
    "FlagContentMismatchError",
    "MalformedJsonError",
    "MessageFieldError",
    "EncodeError",
    "NotNegotiatedError",
]


class WireError(Exception):
    """Base of every local wire error."""


class FrameError(WireError):
    """The 12-byte frame header is unacceptable, or the stream ended inside a frame."""


class BadMagicError(FrameError):
    def __init__(self, magic: int) -> None:
        super().__init__(f"bad frame magic {magic:#010x} (expected 0x464c5831)")
        self.magic = magic


class UnsupportedVersionError(FrameError):
    def __init__(self, version: int) -> None:
        super().__init__(f"unsupported frame version {version} (expected 1)")
        self.version = version


class FrameTooLargeError(FrameError):
    """A header announced more payload than the receiver accepts; raised on the header alone."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame payload of {length} bytes exceeds the limit of {limit}")
        self.length = length
        self.limit = limit


class TruncatedFrameError(FrameError):
    """The stream ended with a partial frame buffered."""

    def __init__(self, buffered: int, needed: int | None) -> None:
        wanted = f" of {needed}" if needed is not None else ""
        super().__init__(f"stream ended inside a frame ({buffered} bytes{wanted} buffered)")
        self.buffered = buffered
        self.needed = needed


class FlagError(WireError):
    """The header's flags do not name a layout this catalogue allows."""

    def __init__(self, message: str, flags: int) -> None:
        super().__init__(message)
        self.flags = flags


class UnknownFlagsError(FlagError):
    """The frame carries a flag bit this implementation does not know (never masked off)."""

    def __init__(self, flags: int, unknown: int) -> None:
        super().__init__(f"unknown frame flag bits {unknown:#06x} in {flags:#06x}", flags)
        self.unknown = unknown


class IllegalFlagCombinationError(FlagError):
    """Every bit is known, but together they describe no legal layout."""

    def __init__(self, flags: int, reason: str) -> None:
        super().__init__(f"illegal frame flag combination {flags:#06x}: {reason}", flags)
        self.reason = reason


class PayloadDecodeError(WireError):
    """A payload could not be decoded; says what, which field and where."""

    def __init__(self, what: str, field: str | None, offset: int | None, problem: str) -> None:
        where = f".{field}" if field else ""
        at = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{what}{where}{at}: {problem}")
        self.what = what
        self.field = field
        self.offset = offset
        self.problem = problem


class TruncatedPayloadError(PayloadDecodeError):
    """The payload ends before a field does."""


class TrailingBytesError(PayloadDecodeError):
    """Bytes remain after the last field of the layout."""


class LengthOutOfRangeError(PayloadDecodeError):
    """A declared length or count exceeds what the payload can hold (checked before allocating)."""


class InvalidUtf8Error(PayloadDecodeError):
    """A text field is not valid UTF-8."""


class InvalidEnumValueError(PayloadDecodeError):
    """A byte that must be one of a closed set of values is not."""


class FlagContentMismatchError(PayloadDecodeError):
    """A flag-selected group contradicts the content (e.g. an offset on a failed ack)."""


class MalformedJsonError(PayloadDecodeError):
    """A flags-0 payload is not one JSON object with a string "type"."""


class MessageFieldError(PayloadDecodeError):
    """A known message type has a missing, ill-typed or out-of-range field."""


class EncodeError(WireError, ValueError):
    """A value cannot be laid out on the wire (out of range, too long, inconsistent groups)."""

    def __init__(self, what: str, field: str | None, problem: str) -> None:
        where = f".{field}" if field else ""
        super().__init__(f"cannot encode {what}{where}: {problem}")
        self.what = what
        self.field = field
        self.problem = problem


class NotNegotiatedError(WireError):
    """A message needs a feature or flag the peer did not announce; nothing was sent."""

    def __init__(self, message_type: str, missing: list[str]) -> None:
        super().__init__(
            f"{message_type} needs {', '.join(missing)}, which the peer did not announce"
        )
        self.message_type = message_type
        self.missing = missing
