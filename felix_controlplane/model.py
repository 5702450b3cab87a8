"""The API's typed refusals, and the name check every definition goes through.

Every definition arrives as JSON over the API. Validation happens before anything
touches the store, so an invalid definition is refused whole with a message naming
the bad field and nothing is written. Streams and caches validate with the shared
definitions of :mod:`felix_common.feed` (the bodies the sync feed carries), whose
:class:`~felix_common.feed.InvalidDefinition` the API answers as 400
``invalid_definition``, like :func:`bad_request`.
"""

from __future__ import annotations

from felix_common import feed

__all__ = ["ApiError", "bad_request", "check_name"]


class ApiError(Exception):
    """A request refused with an HTTP status and a machine-readable code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def bad_request(message: str) -> ApiError:
    return ApiError(400, "invalid_definition", message)


def check_name(value: object, what: str) -> str:
    try:
        return feed.check_name(value, what)
    except feed.InvalidDefinition as exc:
        raise bad_request(str(exc)) from None
