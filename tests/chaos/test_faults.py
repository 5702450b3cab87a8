"""The broker's test-mode fault file: what each fault does to an fsync, and that a
bad file is no fault at all."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from felix_broker.chaos.faults import (
    MAX_CLOCK_OFFSET_MS,
    FaultFile,
    Faults,
    FsyncFault,
    write_fault,
)


def test_no_file_means_a_plain_fsync(tmp_path: Path) -> None:
    synced: list[int] = []
    FaultFile(tmp_path / "faults.json", synced.append).fsync(7)
    assert synced == [7]


def test_a_failing_fsync_raises_eio_and_syncs_nothing(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    write_fault(path, FsyncFault(fail=True))
    synced: list[int] = []
    with pytest.raises(OSError, match="test fault") as raised:
        FaultFile(path, synced.append).fsync(3)
    assert raised.value.errno == 5 and synced == []


def test_a_slow_fsync_sleeps_first_and_heals_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    write_fault(path, FsyncFault(delay_ms=80))
    synced: list[int] = []
    faults = FaultFile(path, synced.append)
    began = time.monotonic()
    faults.fsync(1)
    assert time.monotonic() - began >= 0.08 and synced == [1]
    write_fault(path, FsyncFault())
    time.sleep(0.06)  # past the re-check interval
    began = time.monotonic()
    faults.fsync(2)
    assert time.monotonic() - began < 0.05 and synced == [1, 2]


@pytest.mark.parametrize(
    "text",
    [
        '{"fsync_fail": "yes"}',
        '{"fsync_delay_ms": -1}',
        '{"fsync_dely_ms": 5}',
        "[1]",
        "{",
        '{"peer_blocked": "node-2"}',
        '{"peer_blocked": [2]}',
        '{"peer_blocked": [""]}',
        '{"peer_blocked_out": "node-2"}',
        '{"peer_blocked_in": [null]}',
        '{"clock_offset_ms": "5000"}',
        '{"clock_offset_ms": true}',
        '{"clock_offset_ms": 1.5}',
        '{"clock_offset_ms": 86400001}',
        '{"clock_offset_ms": -86400001}',
        '{"forwards_unanswered": 1}',
        '{"auth_draining": "true"}',
        '{"handler_fault": 1}',
    ],
)
def test_a_bad_fault_file_is_no_fault(tmp_path: Path, text: str) -> None:
    path = tmp_path / "faults.json"
    path.write_text(text)
    synced: list[int] = []
    FaultFile(path, synced.append).fsync(4)
    assert synced == [4]


def test_peer_blocked_names_the_members_cut_off_until_the_file_clears(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    faults = FaultFile(path)
    assert not faults.peer_blocked("node-2")  # no file: no partition
    write_fault(path, Faults(peer_blocked=frozenset({"node-2", "node-3"})))
    time.sleep(0.06)
    assert faults.peer_blocked("node-2") and faults.peer_blocked("node-3")
    assert not faults.peer_blocked("node-1")
    synced: list[int] = []
    FaultFile(path, synced.append).fsync(9)  # a partition does not touch the disk
    assert synced == [9]
    write_fault(path, Faults())
    time.sleep(0.06)
    assert not faults.peer_blocked("node-2")


def test_directional_blocks_and_a_clock_offset_parse_and_round_trip() -> None:
    text = (
        '{"peer_blocked_out": ["node-2"], "peer_blocked_in": ["node-3", "node-1"],'
        ' "clock_offset_ms": -90000}'
    )
    faults = Faults.parse(text)
    assert faults.blocked_out == {"node-2"} and faults.blocked_in == {"node-1", "node-3"}
    assert faults.clock_offset_ms == -90_000 and not faults.peer_blocked and not faults.fail
    assert Faults.parse(json.dumps(faults.to_json())) == faults
    assert Faults.parse('{"clock_offset_ms": 86400000}').clock_offset_ms == MAX_CLOCK_OFFSET_MS
    assert Faults.parse("") == Faults()


def test_one_way_blocks_name_a_direction_and_heal_when_the_file_clears(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    faults = FaultFile(path)
    assert not faults.blocks_out("node-2") and not faults.blocks_in("node-2")
    assert faults.clock_offset_ns() == 0
    write_fault(path, Faults(blocked_out=frozenset({"node-2"}), clock_offset_ms=1500))
    time.sleep(0.06)
    assert faults.blocks_out("node-2") and not faults.blocks_in("node-2")
    assert not faults.blocks_out("node-3") and not faults.peer_blocked("node-2")
    assert faults.clock_offset_ns() == 1_500_000_000
    write_fault(path, Faults(blocked_in=frozenset({"node-2"})))
    time.sleep(0.06)
    assert faults.blocks_in("node-2") and not faults.blocks_out("node-2")
    write_fault(path, Faults())
    time.sleep(0.06)
    assert not faults.blocks_in("node-2") and faults.clock_offset_ns() == 0


def test_the_broker_clock_moves_by_the_offset_and_monotonic_time_does_not(
    tmp_path: Path,
) -> None:
    from felix_broker import clock
    from felix_broker.cache.shard import now_ms
    from felix_broker.streams.engine import now_micros

    path = tmp_path / "faults.json"
    write_fault(path, Faults(clock_offset_ms=-3_600_000))  # an hour back
    clock.install_offset(FaultFile(path).clock_offset_ns)
    try:
        mono, wall = time.monotonic(), time.time()
        assert abs(now_micros() / 1e6 - (wall - 3600)) < 5
        assert abs(now_ms() / 1e3 - (wall - 3600)) < 5
        assert time.monotonic() - mono < 5  # the monotonic clock is the host's
    finally:
        clock.install_offset(None)
    assert abs(clock.wall_us() / 1e6 - time.time()) < 5


def test_a_bad_peer_blocked_is_no_partition(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    path.write_text('{"peer_blocked": ["node-2", 3]}')
    assert not FaultFile(path).peer_blocked("node-2")


def test_the_broker_reads_the_file_only_with_the_knob(tmp_path: Path) -> None:
    from felix_broker.config import load_config

    assert load_config(environ={}).test_faults_file is None
    path = tmp_path / "f.json"
    config = load_config(environ={"FELIX_TEST_FAULTS": str(path)})
    assert config.test_faults_file == path


async def test_a_broker_with_the_knob_fails_and_heals_with_its_fault_file(tmp_path: Path) -> None:
    """Through a real broker: a failing fsync refuses an acknowledged-after-the-write
    publish (outcome unknown, code storage); a slow one only delays it."""
    import felix_client
    from felix_broker.fixture.run import full_rights
    from felix_client.errors import RetryClass, StorageError

    from ..broker.harness import running_broker
    from ..support.wire import NS, TENANT

    faults = tmp_path / "faults.json"
    async with running_broker(
        tmp_path, durable_fsync_mode="on_commit", test_faults_file=str(faults)
    ) as broker:
        assert broker.issuer is not None and broker.ca_path is not None
        token = broker.issuer.mint(TENANT, subject="t", perms=full_rights(TENANT), ttl_seconds=60)
        client = await felix_client.connect(
            f"127.0.0.1:{broker.quic_port}",
            tenant_id=TENANT,
            token=token,
            namespace=NS,
            ca_file=broker.ca_path,
            config=felix_client.ClientConfig(ack_on_commit=True, request_timeout=5),
        )
        try:
            assert await client.publish("log", b"a", key=b"k") == 0
            write_fault(faults, FsyncFault(delay_ms=300))
            time.sleep(0.06)
            began = time.monotonic()
            assert await client.publish("log", b"b", key=b"k") == 1
            assert time.monotonic() - began >= 0.3
            write_fault(faults, FsyncFault(fail=True))
            time.sleep(0.06)
            with pytest.raises(StorageError) as refused:
                await client.publish("log", b"c", key=b"k")
            assert refused.value.retry is RetryClass.OUTCOME_UNKNOWN
        finally:
            await client.aclose()


def test_the_broken_quorum_knob_is_refused_outside_test_mode(tmp_path: Path) -> None:
    from felix_broker.config import ConfigError, load_config

    broken = {"FELIX_TEST_QUORUM_ACK_BEFORE_MAJORITY": "true"}
    with pytest.raises(ConfigError, match="test mode only"):
        load_config(environ=broken)
    config = load_config(environ={**broken, "FELIX_TEST_FAULTS": str(tmp_path / "f.json")})
    assert config.test_quorum_ack_before_majority
    assert not load_config(environ={}).test_quorum_ack_before_majority


async def test_a_broker_whose_clock_jumps_stamps_appends_by_it_never_backwards(
    tmp_path: Path,
) -> None:
    """Through a real broker: append times follow the fault file's clock offset; a
    jump back leaves them flat (a log's append times never decrease, so
    offset_for_time stays a search over a sorted log), a jump forward moves them
    ahead, and offset_for_time answers on the log's own times."""
    import felix_client
    from felix_broker.fixture.run import full_rights

    from ..broker.harness import running_broker
    from ..support.wire import NS, TENANT

    faults = tmp_path / "faults.json"
    async with running_broker(tmp_path, test_faults_file=str(faults)) as broker:
        assert broker.issuer is not None and broker.ca_path is not None
        token = broker.issuer.mint(TENANT, subject="t", perms=full_rights(TENANT), ttl_seconds=60)
        client = await felix_client.connect(
            f"127.0.0.1:{broker.quic_port}",
            tenant_id=TENANT,
            token=token,
            namespace=NS,
            ca_file=broker.ca_path,
            config=felix_client.ClientConfig(ack_on_commit=True, request_timeout=5),
        )
        hour_us = 3_600_000_000
        try:
            assert await client.publish("log", b"a", key=b"k") == 0
            write_fault(faults, Faults(clock_offset_ms=-3_600_000))
            time.sleep(0.06)
            assert await client.publish("log", b"b", key=b"k") == 1
            write_fault(faults, Faults(clock_offset_ms=3_600_000))
            time.sleep(0.06)
            assert await client.publish("log", b"c", key=b"k") == 2
            stamps = [
                r.timestamp_micros
                async for page in client.stream_read("log", start=0, shard=0)
                for r in page.records
            ]
            now_us = time.time_ns() // 1000
            assert len(stamps) == 3 and stamps[0] == stamps[1] < stamps[2]
            assert abs(stamps[0] - now_us) < 60_000_000  # on the host's clock
            assert abs(stamps[2] - (now_us + hour_us)) < 60_000_000  # an hour ahead
            assert await client.offset_for_time("log", now_us + hour_us // 2) == 2
            assert await client.offset_for_time("log", stamps[0]) == 0
        finally:
            await client.aclose()
    from felix_broker import clock

    assert abs(clock.wall_us() - time.time_ns() // 1000) < 60_000_000  # uninstalled on stop


def test_the_forward_drain_and_handler_switches_round_trip_and_heal(tmp_path: Path) -> None:
    """forwards_unanswered, auth_draining and handler_fault (the fixture's
    /unanswered-forwards, /drain and /handler-fault) are read back as written, and an
    empty fault ends them."""
    path = tmp_path / "faults.json"
    on = Faults(forwards_unanswered=True, auth_draining=True, handler_fault=True)
    write_fault(path, on)
    faults = FaultFile(path)
    assert faults.forwards_unanswered() and faults.auth_draining() and faults.handler_fault()
    assert Faults.parse(path.read_text()) == on
    write_fault(path, Faults())
    time.sleep(0.06)  # past the re-check interval
    assert not faults.forwards_unanswered() and not faults.auth_draining()
    assert not faults.handler_fault()
