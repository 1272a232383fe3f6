# The two entry points a new user needs (see README): `make up` and `make test`.
# Everything else is a building block for those two.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup up down test unit lint bench image clean-leaks

setup:            ## system packages (apt) + Python venv; idempotent
	bash scripts/setup.sh

up: setup         ## run aenv on this machine (embedded NATS/Postgres/S3), print E2B_* settings
	$(BIN)/aenv up

down:
	$(BIN)/aenv down

test: setup       ## lint, type-check and the whole test suite (real VMs, real services)
	bash scripts/test.sh

unit: setup       ## pure tests only: no services, no VMs
	$(BIN)/pytest -q tests/unit

lint:
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

image: setup      ## build (or find in cache) the default `base` guest image
	$(BIN)/python -m workers.node.image build-base

bench: setup
	bash scripts/bench.sh
