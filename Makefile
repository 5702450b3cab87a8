# One entry point for people and CI. `make test` is the whole suite; `make run`
# sets up and starts a broker on its embedded defaults.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: setup codegen drift lint types layering unit unit-aioquic test soak chaos bench run clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The peers' Python clients for bench/peers.py (the servers come from the system:
# apt-get install nats-server redis-server).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Regenerate generated/ from spec/ (validates the catalogue first).
codegen: setup
	PYTHONPATH=codegen $(PY) -m felix_codegen

# The generated layer must be exactly what the catalogue produces.
drift: codegen
	git diff --exit-code -- generated/
	@test -z "$$(git status --porcelain -- generated/)" || \
		{ echo "untracked files in generated/: run make codegen and commit"; exit 1; }

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check codegen felix_common felix_broker felix_controlplane felix_transport felix_client conformance chaos tests bench tools

# bench/ is type-checked too: its peers' clients (the bench extra) must be installed.
types: setup $(BENCH_STAMP)
	$(PY) -m mypy codegen/felix_codegen felix_common felix_broker felix_controlplane felix_transport felix_client conformance/felix_conformance chaos bench tools

layering: setup
	$(VENV)/bin/lint-imports

unit: setup
	$(PY) -m pytest

# The broker's and client's QUIC tests again on the other stack (the transport tests cover both
# stacks in one run; qh3 is the default everywhere else), with the conformance kit's whole run
# against the broker and the client tester on both adapters (the broken-client tests stay on
# qh3). Of the fleet's tests, those that touch a transport: tests/broker's one-vs-three-broker
# topologies, forwarding and redirects (test_cluster), the end-to-end run and the peer link
# (whose listener is always aioquic and whose dialer follows the stack: felix_broker/fleet/peer.py).
# The others are about etcd, placement and moves, over links the peer tests already cover.
# Left out as well: the CLI's tests and the README's snippets (the client's own tests cover
# its transport), the kill -9 crash tests (storage), and the kit's fleet runs (the one-broker
# run covers the kit's stack; the main pass runs the kit through a fleet).
ON_BOTH_STACKS := \
	tests/broker tests/client \
	tests/fleet/test_cluster.py tests/fleet/test_fleet_end_to_end.py tests/fleet/test_peer.py \
	"tests/conformance/test_reference_broker.py::test_whole_kit_passes_against_the_reference_broker[one-broker]" \
	tests/conformance/test_client_tester.py::test_felix_client_passes_every_client_case \
	tests/conformance/test_client_tester.py::test_the_official_client_is_reported_case_by_case
NOT_TWICE := --ignore=tests/client/test_cli.py --ignore=tests/client/test_cli_groups.py \
	--ignore=tests/client/test_cli_guarded.py --ignore=tests/client/test_readme.py \
	--ignore=tests/broker/test_guarded_crash.py
unit-aioquic: setup
	FELIX_QUIC_IMPL=aioquic $(PY) -m pytest -q $(ON_BOTH_STACKS) $(NOT_TWICE)

# The whole test suite: what CI runs.
test: drift lint types layering unit unit-aioquic

# The soak of tests/broker/test_soak.py for 30 minutes (make test runs it for 30 s),
# printing RSS and open fds every 30 s.
soak: setup
	FELIX_SOAK_SECONDS=1800 FELIX_SOAK_REPORT_SECONDS=30 $(PY) -m pytest -q -s \
		-p no:cacheprovider tests/broker/test_soak.py

# A long chaos run (chaos/): a real 3-broker fleet, the recorded workload and the seeded
# nemesis for FELIX_CHAOS_SECONDS, then the checker's verdict. History, faults and verdict
# go to FELIX_CHAOS_OUT (default chaos-runs/<time>-seed<seed>); exit 1 on a violation.
# The checked cache is Quorum with 3 replicas (--quorum-cache), so the long run checks
# Quorum cache reads too (the short runs of make test keep the Leader cache).
# make test runs three short runs (tests/chaos/test_runs.py).
FELIX_CHAOS_SECONDS ?= 1800
FELIX_CHAOS_SEED ?= 1
FELIX_CHAOS_OUT ?= chaos-runs/$(shell date -u +%Y%m%dT%H%M%SZ)-seed$(FELIX_CHAOS_SEED)
chaos: setup
	$(PY) -m chaos --seconds $(FELIX_CHAOS_SECONDS) --seed $(FELIX_CHAOS_SEED) \
		--quorum-cache --out $(FELIX_CHAOS_OUT)

bench: setup $(BENCH_STAMP)
	$(PY) bench/codec.py
	$(PY) bench/transport.py --quick
	$(PY) bench/pubsub.py --quick
	$(PY) bench/durable.py --quick
	$(PY) bench/cache.py --quick
	$(PY) bench/client.py --quick
	$(PY) bench/groups.py --quick
	$(PY) bench/guarded.py --quick
	$(PY) bench/read_stall.py --quick
	$(PY) bench/peers.py --quick
	$(PY) bench/cluster.py --quick
	$(PY) bench/replication.py --quick

run: setup
	$(VENV)/bin/felix-broker

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
