"""Broker configuration: defaults, precedence (defaults < file < env < CLI), and errors."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from felix_broker.config import (
    BrokerConfig,
    ConfigError,
    FsyncMode,
    HostPort,
    InvalidConfigValueError,
    QuicImpl,
    SubscriberQueuePolicy,
    UnknownConfigKeyError,
    add_cli_arguments,
    config_from_args,
    load_config,
)

pytestmark = pytest.mark.timeout(10)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The tests use the real os.environ; a FELIX_* variable of the developer's
    # shell must not leak into them.
    for name in list(os.environ):
        if name.startswith("FELIX_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults(tmp_path: Path) -> None:
    config = load_config(cwd=tmp_path)
    assert config.quic_bind == HostPort("0.0.0.0", 5000)
    assert config.metrics_bind == HostPort("0.0.0.0", 8080)
    assert config.max_idle_timeout_ms == 6000
    assert config.preauth_max_frame_bytes == 65536
    assert config.preauth_max_streams_per_conn == 16
    assert config.auth_timeout_ms == 10000
    assert config.max_client_connections == 8192
    assert config.max_frame_bytes == 16 * 1024 * 1024
    assert config.tls_require_alpn is False
    assert config.ack_on_commit is False
    assert config.record_publishers is False
    assert config.publish_window == 256
    assert config.pub_conn_inflight_bytes == 16 * 1024 * 1024
    assert config.pub_inflight_bytes == 64 * 1024 * 1024
    assert config.effective_pub_conn_total_inflight_bytes == 64 * 1024 * 1024
    assert config.pub_queue_depth == 64
    assert config.publish_queue_wait_timeout_ms == 2000
    assert config.subscriber_queue_capacity == 512
    assert config.subscriber_queue_capacity_max == 4096
    assert config.subscriber_queue_policy is SubscriberQueuePolicy.DROP_NEW
    assert config.event_batch_max_events == 64
    assert config.event_batch_max_bytes == 65536
    assert config.event_batch_max_delay_us == 250
    assert config.fanout_batch_size == 64
    assert config.max_subscriptions_per_conn == 4096
    assert config.max_subscriptions_per_conn_total == 16384
    # Durable storage is on by default, in the data directory.
    assert config.durable_storage_dir == tmp_path / "felix-data" / "durable"
    assert config.durable_enabled
    assert (config.durable_retention_max_age_ms, config.durable_retention_max_bytes) == (0, 0)
    assert config.durable_fsync_mode is FsyncMode.PERIODIC
    assert config.group_visibility_timeout_ms == 30000
    assert config.group_max_attempts == 5
    assert config.data_dir == tmp_path / "felix-data"
    assert config.quic_impl is QuicImpl.QH3
    assert config.max_datagram_size == 1200
    assert config.tls_cert is None and config.tls_cert_export is None
    assert config.catalog.stream("t1", "default", "demo") is not None


def test_precedence_defaults_file_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(
        tmp_path,
        "quic_bind: 127.0.0.1:6000\n"
        "metrics_bind: 127.0.0.1:9000\n"
        "publish_window: 10\n"
        "event_batch_max_events: 8\n",
    )
    monkeypatch.setenv("FELIX_BROKER_METRICS_BIND", "127.0.0.2:9100")
    monkeypatch.setenv("FELIX_BROKER_PUBLISH_WINDOW", "20")
    config = load_config(path, overrides={"publish_window": "30"}, cwd=tmp_path)
    assert config.event_batch_max_events == 8  # file over default
    assert config.quic_bind == HostPort("127.0.0.1", 6000)  # file over default
    assert config.metrics_bind == HostPort("127.0.0.2", 9100)  # env over file
    assert config.publish_window == 30  # CLI over env over file
    assert config.event_batch_max_bytes == 65536  # default


def test_cli_parser(tmp_path: Path) -> None:
    path = _write(tmp_path, "quic_bind: 127.0.0.1:6000\nrecord_publishers: false\n")
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    args = parser.parse_args(
        [
            "--config", str(path),
            "--quic-bind", "127.0.0.1:7000",
            "--set", "record_publishers=true",
            "--set", "subscriber_queue_policy=drop_old",
            "--data-dir", "state",
        ]
    )  # fmt: skip
    config = config_from_args(args, environ={"FELIX_QUIC_BIND": "127.0.0.1:6500"}, cwd=tmp_path)
    assert config.quic_bind == HostPort("127.0.0.1", 7000)
    assert config.record_publishers is True
    assert config.subscriber_queue_policy is SubscriberQueuePolicy.DROP_OLD
    assert config.data_dir == tmp_path / "state"


def test_cli_set_needs_key_value(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        config_from_args(parser.parse_args(["--set", "publish_window"]), environ={}, cwd=tmp_path)


def test_env_names_and_alias(tmp_path: Path) -> None:
    env = {
        "FELIX_SUB_QUEUE_CAPACITY": "100",
        "FELIX_TLS_CERT_EXPORT": "exported/ca.pem",
        "FELIX_QUIC_IMPL": "aioquic",
        "FELIX_DURABLE_STORAGE_DIR": "/var/lib/felix",
        "FELIX_TLS_REQUIRE_ALPN": "TRUE",
        "FELIX_MAX_IDLE_TIMEOUT_MS": "1500",
        "FELIX_SOMETHING_ELSE": "ignored",  # other programs' variables are ignored
    }
    config = load_config(environ=env, cwd=tmp_path)
    assert config.subscriber_queue_capacity == 100
    assert config.tls_cert_export == tmp_path / "exported/ca.pem"
    assert config.quic_impl is QuicImpl.AIOQUIC
    assert config.durable_storage_dir == Path("/var/lib/felix") and config.durable_enabled
    assert config.tls_require_alpn is True
    assert config.max_idle_timeout_ms == 1500


def test_canonical_env_name_beats_alias(tmp_path: Path) -> None:
    env = {"FELIX_SUBSCRIBER_QUEUE_CAPACITY": "200", "FELIX_SUB_QUEUE_CAPACITY": "100"}
    assert load_config(environ=env, cwd=tmp_path).subscriber_queue_capacity == 200


def test_empty_optional_path_env_means_unset(tmp_path: Path) -> None:
    config = load_config(environ={"FELIX_DURABLE_STORAGE_DIR": ""}, cwd=tmp_path)
    assert config.durable_storage_dir is None


def test_ipv6_and_hostname_binds(tmp_path: Path) -> None:
    path = _write(tmp_path, "quic_bind: '[::1]:5001'\nmetrics_bind: broker-1.internal:0\n")
    config = load_config(path, environ={}, cwd=tmp_path)
    assert config.quic_bind == HostPort("::1", 5001)
    assert str(config.quic_bind) == "[::1]:5001"
    assert config.metrics_bind == HostPort("broker-1.internal", 0)


def test_catalog_section_is_loaded(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "durable_storage_dir: store\n"
        "catalog:\n"
        "  tenants:\n"
        "    acme:\n"
        "      namespaces:\n"
        "        prod:\n"
        "          streams:\n"
        "            events: {durable: true, shards: 3}\n",
    )
    config = load_config(path, environ={}, cwd=tmp_path)
    spec = config.catalog.stream("acme", "prod", "events")
    assert spec is not None and spec.shards == 3 and spec.durable
    assert config.catalog.stream("t1", "default", "demo") is None  # no default when declared
    assert config.durable_storage_dir == tmp_path / "store"


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, ""), environ={}, cwd=tmp_path)
    assert config.publish_window == BrokerConfig().publish_window


# --- errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "key", "reason"),
    [
        ("publish_widow: 5\n", "publish_widow", "unknown configuration key"),
        ("publish_window: many\n", "publish_window", "expected an integer"),
        ("publish_window: 1.5\n", "publish_window", "expected an integer"),
        ("publish_window: true\n", "publish_window", "expected an integer"),
        ("publish_window: -1\n", "publish_window", "must be between"),
        ("pub_queue_depth: 0\n", "pub_queue_depth", "must be between"),
        ("max_datagram_size: 100\n", "max_datagram_size", "must be between"),
        ("ack_on_commit: 'yes'\n", "ack_on_commit", "expected true or false"),
        ("subscriber_queue_policy: drop_all\n", "subscriber_queue_policy", "drop_new"),
        ("durable_fsync_mode: always\n", "durable_fsync_mode", "on_commit"),
        ("quic_impl: quinn\n", "quic_impl", "qh3, aioquic"),
        ("quic_bind: 5000\n", "quic_bind", "host:port"),
        ("quic_bind: localhost\n", "quic_bind", "host:port"),
        ("quic_bind: 'localhost:http'\n", "quic_bind", "not a number"),
        ("quic_bind: 'localhost:70000'\n", "quic_bind", "out of range"),
        ("quic_bind: 'bad host:5000'\n", "quic_bind", "not a valid host"),
        ("quic_bind: '::1:5000'\n", "quic_bind", "IPv6"),
        ("quic_bind: '999.0.0.1:5000'\n", "quic_bind", "IPv4"),
        ("quic_bind: 'localhost:５０００'\n", "quic_bind", "not a number"),
        ("quic_bind: '[nope]:5000'\n", "quic_bind", "IPv6"),
        ("data_dir: ''\n", "data_dir", "expected a path"),
        ("data_dir: 3\n", "data_dir", "expected a path"),
        (
            "catalog: {tenants: {t1: {namespaces: {ns: {streams: {s: {shards: 0}}}}}}}\n",
            "catalog.tenants.t1.namespaces.ns.streams.s.shards",
            "must be between",
        ),
    ],
)
def test_bad_file_values_name_key_and_file(
    tmp_path: Path, yaml_text: str, key: str, reason: str
) -> None:
    path = _write(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={}, cwd=tmp_path)
    assert info.value.key == key
    assert str(path) in info.value.source
    assert reason in str(info.value)
    assert str(info.value).startswith(f"{key}:")


def test_unknown_key_is_typed(tmp_path: Path) -> None:
    with pytest.raises(UnknownConfigKeyError):
        load_config(_write(tmp_path, "no_such_knob: 1\n"), environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("name", "value", "key"),
    [
        ("FELIX_QUIC_BIND", "nowhere", "quic_bind"),
        ("FELIX_BROKER_METRICS_BIND", "0.0.0.0:-1", "metrics_bind"),
        ("FELIX_SUB_QUEUE_CAPACITY", "lots", "subscriber_queue_capacity"),
        ("FELIX_SUB_QUEUE_CAPACITY", "0", "subscriber_queue_capacity"),
        ("FELIX_RECORD_PUBLISHERS", "maybe", "record_publishers"),
        ("FELIX_SUB_QUEUE_POLICY", "DROP_NEW", "subscriber_queue_policy"),
        ("FELIX_QUIC_IMPL", "quiche", "quic_impl"),
        ("FELIX_DURABLE_FSYNC_MODE", "", "durable_fsync_mode"),
        ("FELIX_DATA_DIR", " ", "data_dir"),
    ],
)
def test_bad_env_values_name_key_and_variable(
    tmp_path: Path, name: str, value: str, key: str
) -> None:
    with pytest.raises(InvalidConfigValueError) as info:
        load_config(environ={name: value}, cwd=tmp_path)
    assert info.value.key == key
    assert info.value.source == f"environment variable {name}"
    assert name in str(info.value)


def test_bad_cli_values(tmp_path: Path) -> None:
    with pytest.raises(UnknownConfigKeyError) as unknown:
        load_config(environ={}, overrides={"nope": "1"}, cwd=tmp_path)
    assert unknown.value.source == "command line"
    with pytest.raises(InvalidConfigValueError) as bad:
        load_config(environ={}, overrides={"fanout_batch_size": "0"}, cwd=tmp_path)
    assert bad.value.key == "fanout_batch_size" and bad.value.source == "command line"
    with pytest.raises(InvalidConfigValueError):
        load_config(environ={}, overrides={"fanout_batch_size": 2.5}, cwd=tmp_path)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "a: [1, 2\n"), environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path, "- 1\n- 2\n"), environ={}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("tls_cert: a.pem\n", "tls_key"),
        ("tls_key: a.key\n", "tls_cert"),
        ("tls_ca: ca.pem\n", "tls_ca"),
        ("subscriber_queue_capacity: 5000\n", "subscriber_queue_capacity"),
        ("preauth_max_frame_bytes: 100\nmax_frame_bytes: 50\n", "preauth_max_frame_bytes"),
        (
            # durable storage turned off, a durable stream declared anyway
            "durable_storage_dir: null\n"
            "catalog: {tenants: {t1: {namespaces: {ns: {streams: {s: {durable: true}}}}}}}\n",
            "catalog.tenants.t1.namespaces.ns.streams.s.durable",
        ),
    ],
)
def test_cross_checks(tmp_path: Path, yaml_text: str, key: str) -> None:
    with pytest.raises(InvalidConfigValueError) as info:
        load_config(_write(tmp_path, yaml_text), environ={}, cwd=tmp_path)
    assert info.value.key == key


def test_derived_values(tmp_path: Path) -> None:
    config = load_config(
        environ={
            "FELIX_BROKER_PUBLISH_CONN_INFLIGHT_BYTES": "1000",
            "FELIX_GROUP_VISIBILITY_TIMEOUT_MS": "50000",
            "FELIX_GROUP_MAX_VISIBILITY_MS": "40000",
            "FELIX_SUB_WRITER_LANES": "16",
        },
        cwd=tmp_path,
    )
    assert config.effective_pub_conn_total_inflight_bytes == 4000
    assert config.effective_group_max_visibility_ms == 50000
    assert config.subscriber_writer_lanes == 16
    assert "subscriber_writer_lanes" in config.ignored_knobs()


def test_hostport_parse_round_trip() -> None:
    for text in ("0.0.0.0:5000", "[::]:0", "localhost:8080"):
        assert str(HostPort.parse(text)) == text


def test_durable_storage_can_be_turned_off_with_an_empty_value(tmp_path: Path) -> None:
    config = load_config(environ={"FELIX_DURABLE_STORAGE_DIR": ""}, cwd=tmp_path)
    assert config.durable_storage_dir is None and not config.durable_enabled
    data = load_config(environ={"FELIX_DATA_DIR": "/srv/felix"}, cwd=tmp_path)
    assert data.durable_storage_dir == Path("/srv/felix/durable")
