"""RBAC: policies (sets of grants), assignments (who gets a policy), narrowing, admin checks.

A policy is ``{"name", "permissions": ["<action>:<kind>:<path>", ...]}`` in
exactly the syntax of :mod:`felix_common.permissions` (each grant is parsed by
it, so a policy can never produce a token a broker would refuse). On top of
that syntax a policy of tenant T may only name objects of T: the first path
segment must be T, so neither ``stream.publish:*`` nor ``stream.publish:stream:*``
can be stored (a token must never reach into another tenant). The one
cluster-wide grant, ``node.view:cluster:*``, is allowed as is.

An assignment is ``{"name", "policy", "subjects": [...], "groups": [...]}``.
Subjects are Felix subjects (``<upstream issuer>#<upstream sub>``); groups are
qualified the same way (``<upstream issuer>#<group>``), so a group name from one
identity provider can never match a group of another.

Control-plane calls are checked against the same actions: managing a stream
needs ``stream.manage`` on it, a cache ``cache.manage``; a namespace needs both
on ``<tenant>/<namespace>/*``; tenant-wide settings (policies, assignments,
identity providers, keys, the namespace list, the tenant itself) need both on
``<tenant>/*``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from felix_common.permissions import (
    NODE_VIEW_GRANT,
    Action,
    InvalidPermissionError,
    PermissionSet,
)
from felix_controlplane.model import ApiError, bad_request, check_name

__all__ = [
    "effective_grants",
    "narrow",
    "require",
    "require_namespace_admin",
    "require_tenant_admin",
    "tenant_admin_grants",
    "validate_assignment",
    "validate_policy",
]

_KINDS = {"stream": 3, "cache": 3, "group": 4}


@dataclass(frozen=True, slots=True)
class _Object:
    kind: str
    prefix: tuple[str, ...]
    wildcard: bool

    def text(self) -> str:
        path = "/".join(self.prefix + (("*",) if self.wildcard else ()))
        return f"{self.kind}:{path}"

    def covers(self, other: _Object) -> bool:
        """Whether every concrete object ``other`` matches is matched by ``self``."""
        if self.kind != other.kind:
            return False
        if not self.wildcard:
            return not other.wildcard and self.prefix == other.prefix
        n = len(self.prefix)
        if other.prefix[:n] != self.prefix:
            return False
        # t1/* matches one or more segments after t1: t1/ns/* and t1/ns/s lie inside.
        return len(other.prefix) > n or (other.wildcard and len(other.prefix) == n)


def _parse_object(text: str, what: str) -> _Object:
    kind, sep, path = text.partition(":")
    if not sep or kind not in _KINDS or not path:
        raise bad_request(f"{what}: expected '<stream|cache|group>:<path>', got {text!r}")
    segments = tuple(path.split("/"))
    wildcard = segments[-1] == "*"
    fixed = segments[:-1] if wildcard else segments
    if any(not s or "*" in s for s in fixed):
        raise bad_request(f"{what}: '*' only as the last path segment, no empty segments")
    limit = _KINDS[kind]
    if (wildcard and not 1 <= len(fixed) < limit) or (not wildcard and len(fixed) != limit):
        raise bad_request(f"{what}: a {kind} path has {limit} segments, got {text!r}")
    return _Object(kind, fixed, wildcard)


def _split_grant(grant: str) -> tuple[str, str]:
    action, _, obj = grant.partition(":")
    return action, obj


def _check_grant(tenant: str, grant: object, what: str) -> str:
    if not isinstance(grant, str):
        raise bad_request(f"{what}: a permission is a string")
    try:
        PermissionSet.parse([grant])
    except InvalidPermissionError as exc:
        raise bad_request(f"{what}: {exc}") from None
    if grant == NODE_VIEW_GRANT:
        return grant
    _, obj = _split_grant(grant)
    parsed = _parse_object(obj, what)
    if parsed.prefix[0] != tenant:
        raise bad_request(f"{what}: a policy of tenant {tenant!r} may only name its own objects")
    return grant


def validate_grants(tenant: str, raw: object, what: str) -> list[str]:
    """A list of grants of ``tenant`` (possibly empty), each checked like a policy's."""
    if not isinstance(raw, list):
        raise bad_request(f"{what}: expected a list of permissions")
    return [_check_grant(tenant, g, f"{what}[{i}]") for i, g in enumerate(raw)]


def _strings(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise bad_request(f"{what}: expected a list of non-empty strings")
    return list(value)


def _object_body(body: object, allowed: frozenset[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise bad_request(f"{what}: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"{what}: unknown field {unknown[0]!r}")
    return body


def validate_policy(tenant: str, name: str, body: object) -> dict[str, Any]:
    fields = _object_body(body, frozenset({"name", "permissions"}), "policy")
    if fields.get("name", name) != name:
        raise bad_request("policy.name: differs from the name in the path")
    check_name(name, "policy.name")
    raw = fields.get("permissions")
    if not isinstance(raw, list) or not raw:
        raise bad_request("policy.permissions: expected a non-empty list")
    grants = [_check_grant(tenant, g, f"policy.permissions[{i}]") for i, g in enumerate(raw)]
    return {"name": name, "permissions": grants}


def validate_assignment(name: str, body: object) -> dict[str, Any]:
    fields = _object_body(body, frozenset({"name", "policy", "subjects", "groups"}), "assignment")
    if fields.get("name", name) != name:
        raise bad_request("assignment.name: differs from the name in the path")
    check_name(name, "assignment.name")
    policy = check_name(fields.get("policy"), "assignment.policy")
    subjects = _strings(fields.get("subjects"), "assignment.subjects")
    groups = _strings(fields.get("groups"), "assignment.groups")
    if not subjects and not groups:
        raise bad_request("assignment: name at least one subject or group")
    return {"name": name, "policy": policy, "subjects": subjects, "groups": groups}


def effective_grants(
    policies: Mapping[str, Mapping[str, Any]],
    assignments: Iterable[Mapping[str, Any]],
    subject: str,
    groups: Iterable[str],
) -> list[str]:
    """Every grant of every policy assigned to ``subject`` or one of ``groups``, deduplicated."""
    group_set = set(groups)
    grants: dict[str, None] = {}
    for assignment in assignments:
        if subject not in assignment["subjects"] and not group_set & set(assignment["groups"]):
            continue
        policy = policies.get(assignment["policy"])
        if policy is None:  # assigned policy deleted since: grants nothing
            continue
        for grant in policy["permissions"]:
            grants[grant] = None
    return list(grants)


def narrow(
    grants: Sequence[str], actions: Sequence[str] | None, resources: Sequence[str] | None
) -> list[str]:
    """Restrict ``grants`` to the requested actions and resources (never widen them).

    A grant survives a resource request as the narrower of the two objects:
    ``stream.publish:stream:t1/*`` asked for ``stream:t1/ns/orders`` becomes
    ``stream.publish:stream:t1/ns/orders``.
    """
    if actions is not None:
        for action in actions:
            try:
                Action(action)
            except ValueError:
                raise bad_request(f"actions: unknown action {action!r}") from None
        grants = [g for g in grants if _split_grant(g)[0] in actions]
    if resources is None:
        return list(grants)
    wanted = [_parse_object(r, "resources") for r in resources]
    out: dict[str, None] = {}
    for grant in grants:
        if grant == NODE_VIEW_GRANT:
            continue  # not an object a resource request can name
        action, obj = _split_grant(grant)
        granted = _parse_object(obj, "grant")
        for resource in wanted:
            if granted.covers(resource):
                out[f"{action}:{resource.text()}"] = None
            elif resource.covers(granted):
                out[grant] = None
    return list(out)


def tenant_admin_grants(tenant: str) -> list[str]:
    """The grants of a tenant administrator (what bootstrap assigns)."""
    return [
        f"{Action.STREAM_MANAGE.value}:stream:{tenant}/*",
        f"{Action.CACHE_MANAGE.value}:cache:{tenant}/*",
        f"{Action.GROUP_MANAGE.value}:group:{tenant}/*",
        f"{Action.STREAM_PUBLISH.value}:stream:{tenant}/*",
        f"{Action.STREAM_SUBSCRIBE.value}:stream:{tenant}/*",
        f"{Action.CACHE_READ.value}:cache:{tenant}/*",
        f"{Action.CACHE_WRITE.value}:cache:{tenant}/*",
    ]


def _forbidden(what: str) -> ApiError:
    return ApiError(403, "forbidden", f"forbidden: the token lacks {what}")


def require(perms: PermissionSet, action: Action, obj: str) -> None:
    # A wildcard object ("stream:t1/ns/*") is only matched by grants that cover
    # all of it, because '*' is not a valid name segment.
    if not perms.allows(action, obj):
        raise _forbidden(f"{action.value} on {obj}")


def require_namespace_admin(perms: PermissionSet, tenant: str, namespace: str) -> None:
    require(perms, Action.STREAM_MANAGE, f"stream:{tenant}/{namespace}/*")
    require(perms, Action.CACHE_MANAGE, f"cache:{tenant}/{namespace}/*")


def require_tenant_admin(perms: PermissionSet, tenant: str) -> None:
    require(perms, Action.STREAM_MANAGE, f"stream:{tenant}/*")
    require(perms, Action.CACHE_MANAGE, f"cache:{tenant}/*")
