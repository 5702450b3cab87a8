"""The target profile: what the kit is told about a broker it cannot discover.

A YAML document validated by `schema/profile.schema.json`: where the broker is
and how to trust it, the credentials, the streams and caches cases may use,
the extra tokens of the forbidden cases, and the control endpoint the fault
cases ask for a fault (`control_url`, with `streams.movable_stream` or
`streams.quorum_stream`), and a broker with small bounds the limit cases reach
(`limited_broker`).
Everything is optional; the command line overrides it, and a case needing a
name it lacks gets "setup". Relative paths in it are relative to the profile's
own folder.

`felix-conformance profile --fixture fx.json --out profile.yaml` writes one from
a `felix-broker fixture` document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .target import CACHE_VARIABLES, LIMITED_BROKER, STREAM_VARIABLES, fixture_ca_file

__all__ = ["Profile", "ProfileError", "load_profile", "profile_from_fixture", "render_profile"]

_TOKENS = ("unauthorized_token", "inspector_token")


class ProfileError(ValueError):
    """A profile that is not valid YAML or does not follow the schema."""


@dataclass(frozen=True)
class Profile:
    target: str | None = None
    ca_file: Path | None = None
    server_name: str | None = None
    variables: dict[str, Any] = field(default_factory=dict)


@cache
def _schema() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("schema/profile.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def load_profile(path: Path) -> Profile:
    try:
        document: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    document = {} if document is None else document
    errors = sorted(
        jsonschema.Draft202012Validator(_schema()).iter_errors(document),
        key=lambda e: -len(e.absolute_path),
    )
    if errors:
        best = jsonschema.exceptions.best_match(errors) or errors[0]
        where = ".".join(str(p) for p in best.absolute_path) or "(document)"
        raise ProfileError(f"{path}: {where}: {best.message}")
    folder = path.parent
    variables: dict[str, Any] = dict(document.get("variables", {}))
    for name in ("tenant_id", "namespace", "other_tenant", "token", "control_url", LIMITED_BROKER):
        if name in document:
            variables[name] = document[name]
    if "token_file" in document:
        variables["token"] = (folder / document["token_file"]).read_text().strip()
    for section in ("streams", "caches", "tokens"):
        variables.update(document.get(section, {}))
    if "brokers" in document:
        variables["brokers"] = list(document["brokers"])
    ca_file = folder / document["ca_file"] if "ca_file" in document else None
    return Profile(document.get("target"), ca_file, document.get("server_name"), variables)


def profile_from_fixture(fixture: Path) -> dict[str, Any]:
    """The profile document describing the broker of a `felix-broker fixture` document."""
    document: dict[str, Any] = json.loads(fixture.read_text())
    out: dict[str, Any] = {
        "target": document["addrs"][0],
        "ca_file": str(fixture_ca_file(fixture, document).resolve()),
        "server_name": "localhost",
    }
    if len(document["addrs"]) > 1:  # a fleet: the cluster cases connect to every broker
        out["brokers"] = list(document["addrs"])
    for name in ("tenant_id", "token", "namespace"):
        if name in document:
            out[name] = document[name]
    faults = ("movable_stream", "quorum_stream", "quorum_cache", "limited_addrs")
    if "control_url" in document and any(name in document for name in faults):
        # A fleet fixture fences movable_stream on POST /fence and cuts quorum_stream's
        # (quorum_cache's) leader off on POST /partition (/partition-cache); any fixture
        # with a limited broker fails its fsyncs on POST /storage-fault: the fault cases
        # run.
        out["control_url"] = document["control_url"]
    if document.get("limited_addrs"):
        out[LIMITED_BROKER] = document["limited_addrs"][0]
    sections = {
        "streams": (*STREAM_VARIABLES, "missing_stream"),
        "caches": CACHE_VARIABLES,
        "tokens": _TOKENS,
    }
    for section, names in sections.items():
        values = {n: document[n] for n in names if n in document}
        if values:
            out[section] = values
    return out


_HEADER = """\
# felix-conformance target profile (schema: felix_conformance/schema/profile.schema.json).
# What the kit cannot discover about the broker; the command line overrides each
# entry, and a case needing a name this lacks gets the verdict "setup", never "fail".
"""


def render_profile(document: dict[str, Any]) -> str:
    jsonschema.validate(document, _schema())
    return _HEADER + yaml.safe_dump(document, sort_keys=False, width=100)
