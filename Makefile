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

.PHONY: help install kafka-up kafka-down kafka-status topics worker demo test unit integration bench lint schemas clean

help:
	@echo "make demo        broker + worker + simulator with incidents, live SLI table, report"
	@echo "make test        install, start a test broker, run the whole suite, stop the broker"
	@echo "make bench       hot-path, throughput and burst benchmarks -> bench/results/*.json"
	@echo "make kafka-up    start the local Kafka broker (KRaft, Java 17, Maven jars)"
	@echo "make kafka-down  stop it"
	@echo "make unit        unit tests only (no broker)"
	@echo "make lint        ruff"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

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

integration: install
	@$(TEST_ENV) $(KAFKA) reset >/dev/null
	@$(TEST_ENV) $(KAFKA) up
	@status=0; TAILGUARD_BROKER=$(TEST_BROKER) TAILGUARD_TEST_STATE=$(TEST_STATE) \
		$(BIN)/python -m pytest tests/integration -q || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

# The whole suite against a fresh test broker (fresh broker + fresh worker
# state together: faust's recovery consistency check, SPEC.md §7).
test: install
	@$(TEST_ENV) $(KAFKA) reset >/dev/null
	@$(TEST_ENV) $(KAFKA) up
	@status=0; TAILGUARD_BROKER=$(TEST_BROKER) TAILGUARD_TEST_STATE=$(TEST_STATE) \
		$(BIN)/python -m pytest tests -q || status=$$?; \
		$(TEST_ENV) $(KAFKA) down; exit $$status

bench: install
	@$(TEST_ENV) $(KAFKA) up
	@status=0; $(BIN)/python -m bench.hotpath && \
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
