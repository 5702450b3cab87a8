"""Felix token permissions: parse the ``perms`` claim once, check it per operation.

A grant is ``"<action>:<object>"``. The object is either ``*`` (anything) or
``"<kind>:<path>"`` where the path is ``/``-separated:

======================  ===========  =========================================
action                  object kind  path
======================  ===========  =========================================
``stream.publish``      ``stream``   ``{tenant}/{namespace}/{stream}``
``stream.subscribe``    ``stream``   ``{tenant}/{namespace}/{stream}``
``stream.manage``       ``stream``   ``{tenant}/{namespace}/{stream}``
``cache.read``          ``cache``    ``{tenant}/{namespace}/{cache}``
``cache.write``         ``cache``    ``{tenant}/{namespace}/{cache}``
``cache.manage``        ``cache``    ``{tenant}/{namespace}/{cache}``
``group.consume``       ``group``    ``{tenant}/{namespace}/{stream}/{group}``
``group.manage``        ``group``    ``{tenant}/{namespace}/{stream}/{group}``
``node.view``           ``cluster``  ``*`` only
======================  ===========  =========================================

The protocol facts name only ``stream.subscribe``, ``stream.manage``,
``group.consume``, ``group.manage`` and ``node.view:cluster:*``; the names for
publishing and cache operations are unspecified there (U15), so
``stream.publish``, ``cache.read``, ``cache.write`` and ``cache.manage`` are
this project's choice.

Wildcards: ``*`` is allowed only as the whole object or as the last path
segment (``t1/*``, ``t1/ns/*``), where it matches one or more trailing
segments. Anything else (``t1/*/orders``, ``ord*``) is a malformed grant.

Rules from §9 (Q17, X1):

* ``group.consume`` on a group is also granted by ``stream.subscribe`` on the
  group's stream; ``group.manage`` likewise by ``stream.manage``.
* ``node.view`` needs the exact grant ``node.view:cluster:*``; a wildcard
  grant such as ``node.view:*`` does not count.

A token carrying an unknown action or a malformed grant is refused as a whole
(:class:`InvalidPermissionError`): half-understanding a credential is worse
than refusing it, because the issuer meant something we would silently drop.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "NODE_VIEW_GRANT",
    "Action",
    "InvalidPermissionError",
    "PermissionSet",
    "cache_object",
    "cluster_object",
    "group_object",
    "stream_object",
]


class Action(StrEnum):
    """Every action a ``perms`` grant may name."""

    STREAM_PUBLISH = "stream.publish"
    STREAM_SUBSCRIBE = "stream.subscribe"
    STREAM_MANAGE = "stream.manage"
    CACHE_READ = "cache.read"
    CACHE_WRITE = "cache.write"
    CACHE_MANAGE = "cache.manage"
    GROUP_CONSUME = "group.consume"
    GROUP_MANAGE = "group.manage"
    NODE_VIEW = "node.view"


# The object kind each action applies to, and how many path segments a
# concrete object of that kind has.
_KIND: dict[Action, str] = {
    Action.STREAM_PUBLISH: "stream",
    Action.STREAM_SUBSCRIBE: "stream",
    Action.STREAM_MANAGE: "stream",
    Action.CACHE_READ: "cache",
    Action.CACHE_WRITE: "cache",
    Action.CACHE_MANAGE: "cache",
    Action.GROUP_CONSUME: "group",
    Action.GROUP_MANAGE: "group",
    Action.NODE_VIEW: "cluster",
}
_SEGMENTS: dict[str, int] = {"stream": 3, "cache": 3, "group": 4}

# A group action is also granted by this stream action on the group's stream.
_GROUP_VIA_STREAM: dict[Action, Action] = {
    Action.GROUP_CONSUME: Action.STREAM_SUBSCRIBE,
    Action.GROUP_MANAGE: Action.STREAM_MANAGE,
}

NODE_VIEW_GRANT = "node.view:cluster:*"
_WILDCARD = "*"


class InvalidPermissionError(ValueError):
    """A ``perms`` entry is malformed or names an unknown action."""

    def __init__(self, grant: str, reason: str) -> None:
        super().__init__(f"invalid permission {grant!r}: {reason}")
        self.grant = grant
        self.reason = reason


def stream_object(tenant_id: str, namespace: str, stream: str) -> str:
    """The object string of a stream, e.g. ``stream:t1/ns/orders``."""
    return f"stream:{tenant_id}/{namespace}/{stream}"


def cache_object(tenant_id: str, namespace: str, cache: str) -> str:
    """The object string of a cache, e.g. ``cache:t1/ns/sessions``."""
    return f"cache:{tenant_id}/{namespace}/{cache}"


def group_object(tenant_id: str, namespace: str, stream: str, group: str) -> str:
    """The object string of a consumer group, e.g. ``group:t1/ns/jobs/g1``."""
    return f"group:{tenant_id}/{namespace}/{stream}/{group}"


def cluster_object() -> str:
    """The object string ``node.view`` is checked against."""
    return "cluster:*"


@dataclass(frozen=True, slots=True)
class _Grant:
    """One compiled grant: ``kind`` None means the object was ``*``."""

    kind: str | None
    prefix: tuple[str, ...]
    wildcard: bool

    def matches(self, kind: str, segments: tuple[str, ...]) -> bool:
        if self.kind is None:
            return True
        if self.kind != kind:
            return False
        if self.wildcard:
            n = len(self.prefix)
            return len(segments) > n and segments[:n] == self.prefix
        return segments == self.prefix


def _compile(grant: str) -> tuple[Action, _Grant]:
    action_text, sep, obj = grant.partition(":")
    if not sep or not obj:
        raise InvalidPermissionError(grant, "expected '<action>:<object>'")
    try:
        action = Action(action_text)
    except ValueError:
        raise InvalidPermissionError(grant, f"unknown action {action_text!r}") from None
    if obj == _WILDCARD:
        return action, _Grant(kind=None, prefix=(), wildcard=True)
    kind, sep, path = obj.partition(":")
    if not sep or not path:
        raise InvalidPermissionError(grant, "expected object '*' or '<kind>:<path>'")
    if kind != _KIND[action]:
        raise InvalidPermissionError(
            grant, f"action {action.value} applies to {_KIND[action]!r} objects, not {kind!r}"
        )
    if action is Action.NODE_VIEW:
        if path != _WILDCARD:
            raise InvalidPermissionError(grant, "node.view only takes the object 'cluster:*'")
        return action, _Grant(kind=kind, prefix=(), wildcard=True)
    segments = tuple(path.split("/"))
    wildcard = segments[-1] == _WILDCARD
    fixed = segments[:-1] if wildcard else segments
    for segment in fixed:
        if not segment:
            raise InvalidPermissionError(grant, "empty path segment")
        if _WILDCARD in segment:
            raise InvalidPermissionError(grant, "'*' is allowed only as the last path segment")
    limit = _SEGMENTS[kind]
    if wildcard and len(fixed) >= limit:
        raise InvalidPermissionError(grant, f"a {kind} path has only {limit} segments")
    if not wildcard and len(fixed) != limit:
        raise InvalidPermissionError(grant, f"a {kind} path has exactly {limit} segments")
    return action, _Grant(kind=kind, prefix=fixed, wildcard=wildcard)


def _split_object(obj: str) -> tuple[str, tuple[str, ...]]:
    kind, _, path = obj.partition(":")
    return kind, tuple(path.split("/"))


class PermissionSet:
    """The compiled ``perms`` of one token; build once, ask per operation."""

    __slots__ = ("_grants", "_node_view", "_raw")

    def __init__(
        self, grants: dict[Action, tuple[_Grant, ...]], node_view: bool, raw: tuple[str, ...]
    ) -> None:
        self._grants = grants
        self._node_view = node_view
        self._raw = raw

    @classmethod
    def parse(cls, perms: Iterable[str]) -> PermissionSet:
        """Compile ``perms``; raise :class:`InvalidPermissionError` on any bad entry."""
        raw: list[str] = []
        compiled: dict[Action, list[_Grant]] = {}
        node_view = False
        for grant in perms:
            if not isinstance(grant, str):
                raise InvalidPermissionError(repr(grant), "a permission must be a string")
            action, compiled_grant = _compile(grant)
            raw.append(grant)
            if action is Action.NODE_VIEW:
                node_view = node_view or grant == NODE_VIEW_GRANT
                continue
            compiled.setdefault(action, []).append(compiled_grant)
        grants = {action: tuple(items) for action, items in compiled.items()}
        return cls(grants, node_view, tuple(raw))

    @property
    def grants(self) -> tuple[str, ...]:
        """The grants as the token carried them, in order."""
        return self._raw

    def allows(self, action: Action | str, obj: str) -> bool:
        """Whether ``action`` on the concrete object ``obj`` is granted.

        ``obj`` is built with :func:`stream_object`, :func:`cache_object`,
        :func:`group_object` or :func:`cluster_object`. An unknown action is
        simply not allowed.
        """
        try:
            act = Action(action)
        except ValueError:
            return False
        if act is Action.NODE_VIEW:
            # X1: only the literal grant counts, never a wildcard.
            return self._node_view and obj == cluster_object()
        kind, segments = _split_object(obj)
        if self._match(act, kind, segments):
            return True
        via = _GROUP_VIA_STREAM.get(act)
        if via is not None and kind == "group" and len(segments) == 4:
            return self._match(via, "stream", segments[:3])
        return False

    def _match(self, action: Action, kind: str, segments: tuple[str, ...]) -> bool:
        return any(g.matches(kind, segments) for g in self._grants.get(action, ()))

    def __repr__(self) -> str:
        return f"PermissionSet({list(self._raw)!r})"
