# tailguard — the two commands a new user needs are `make demo` and `make test`.
# Everything they need is installed here, nothing by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STATE  ?= $(CURDIR)/.state
KAFKA  := infra/kafka/kafka.sh

# The test suite runs its own broker (own state dir and ports), so a demo
# broker on 9092 and `make test` never meet.
TEST_STATE  := $(STATE)/test
TEST_PORT   := 19092
TEST_CPORT  := 19093
TEST_BROKER := 127.0.0.1:$(TEST_PORT)
TEST_ENV    := TAILGUARD_STATE_DIR=$(TEST_STATE) TAILGUARD_KAFKA_PORT=$(TEST_PORT) TAILGUARD_KAFKA_CONTROLLER_PORT=$(TEST_CPORT)

.PHONY: help install tools kafka-up kafka-down kafka-status topics worker demo test unit integration bench bench-ab bench-gateway bench-instructions lint schemas clean

help:
	@echo "make demo        broker + worker + simulator with incidents, live SLI table, report"
	@echo "make test        install, start a test broker, run the whole suite, stop the broker"
	@echo "make bench       hot-path, throughput and burst benchmarks -> bench/results/*.json"
	@echo "make bench-ab    A/B guard statistical harness -> bench/results/ab_guard.json"
	@echo "make bench-gateway  gateway added latency vs direct, 200 streams -> bench/results/gateway.json"
	@echo "make bench-instructions  instructions per event of the hot path and per series of a close (callgrind) -> bench/results/instructions.json"
	@echo "make kafka-up    start the local Kafka broker (KRaft, Java 17, Maven jars)"
	@echo "make kafka-down  stop it"
	@echo "make unit        unit tests only (no broker)"
	@echo "make lint        ruff"
	@echo "make tools       Debian packages the tests need: promtool (prometheus), chromium"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

# System tools of the integration tests (Debian): promtool checks the worker's
# /metrics, headless Chromium loads its dashboard. Installed only where missing
# (sudo when not root). The `prometheus` package is the one that ships promtool;
# --no-install-recommends keeps its node exporter out.
tools:
	@missing=""; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		sudo=""; [ "$$(id -u)" -eq 0 ] || sudo="sudo"; \
		echo "· installing Debian packages:$$missing"; \
		$$sudo apt-get update -qq && \
		$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

kafka-up: install
	@TAILGUARD_STATE_DIR=$(STATE) $(KAFKA) up

kafka-down:
	@TAILGUARD_STATE_DIR=$(STATE) $(KAFKA) down

kafka-status:
	@TAILGUARD_STATE_DIR=$(STATE) $(KAFKA) status

topics: kafka-up
	$(BIN)/tailguard topics create

worker: topics
	$(BIN)/tailguard worker

demo: install
	@STATE=$(STATE) BIN=$(BIN) ./infra/demo.sh

unit: install
	$(BIN)/python -m pytest tests/unit -q

integration: install tools
	@$(TEST_ENV) $(KAFKA) reset >/dev/null
	@$(TEST_ENV) $(KAFKA) up
	@status=0; TAILGUARD_BROKER=$(TEST_BROKER) TAILGUARD_TEST_STATE=$(TEST_STATE) \
		$(BIN)/python -m pytest tests/integration -q || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

# The whole suite against a fresh test broker (fresh broker + fresh worker
# state together: faust refuses a table store ahead of its changelog topic).
test: install tools
	@$(TEST_ENV) $(KAFKA) reset >/dev/null
	@$(TEST_ENV) $(KAFKA) up
	@status=0; TAILGUARD_BROKER=$(TEST_BROKER) TAILGUARD_TEST_STATE=$(TEST_STATE) \
		$(BIN)/python -m pytest tests -q || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

# The A/B guard's statistical harness (no broker): bench/results/ab_guard.json.
bench-ab: install
	$(BIN)/python -m bench.ab_guard

# The gateway's added latency against a direct-to-upstream baseline of the same run
# (events published to the test broker when it runs): bench/results/gateway.json.
bench-gateway: install
	@$(TEST_ENV) $(KAFKA) up
	@status=0; TAILGUARD_BROKER=$(TEST_BROKER) $(BIN)/python -m bench.gateway || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

# Instructions per event of the hot path, counted with callgrind (needs valgrind): a
# figure the machine's drift does not move, for comparing commits on a shared machine.
bench-instructions: install
	$(BIN)/python -m bench.instructions

bench: install bench-ab
	@$(TEST_ENV) $(KAFKA) up
	@status=0; $(BIN)/python -m bench.hotpath && $(BIN)/python -m bench.close && \
		$(BIN)/python -m bench.wire && \
		TAILGUARD_BROKER=$(TEST_BROKER) $(BIN)/python -m bench.throughput && \
		TAILGUARD_BROKER=$(TEST_BROKER) $(BIN)/python -m bench.burst || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

schemas: install
	$(BIN)/python -m tailguard.schemas.generate

lint: install
	$(BIN)/ruff check streams schemas agents tailguard tests bench

clean:
	-@TAILGUARD_STATE_DIR=$(STATE) $(KAFKA) down
	-@$(TEST_ENV) $(KAFKA) down
	rm -rf $(STATE) .pytest_cache .hypothesis
