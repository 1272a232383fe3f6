# The two entry points a new user needs (see README): `make up` and `make test`.
# Everything else is a building block for those two.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup up down test test-fast test-scale test-catalogue unit lint bench image clean-leaks dist constraints

setup:            ## system packages (apt) + Python venv; idempotent
	bash scripts/setup.sh

up: setup         ## run aenv on this machine (embedded NATS/Postgres/S3), print E2B_* settings
	$(BIN)/aenv up

down:
	$(BIN)/aenv down

test: setup       ## the gates, then every tier, fast ones first (real VMs, real services)
	bash scripts/test.sh

test-fast: setup  ## the gates and the tiers without VMs (unit, golden, deploy, contract, vmless)
	bash scripts/test.sh --fast

test-scale: setup ## the scale checks (real VMs, minutes each): 50 pause/resume cycles of one sandbox; 50 template builds and their deletion leave the RAM pool within its bound; 2.3 and 6 GiB registry images as sandboxes (~32 GB free disk); 10 creates each of three templates made on another node; a drain of 10 sandboxes; a trainer killed holding 20 leased VMs and a bulk kill of 20 VMs; kill -9 of the node at each point of a resume and of a pause's upload (12 cases); a rolling upgrade of both nodes holding 10; a 60 s command whose client is cut at 10 s; a 2 GiB image started lazily on a node that never held it (< 25 % fetched); a snapshot forked into 24 children across two nodes; two images on a 400 MiB base share all but the 50 MiB layer's chunks; a second image on a base started lazily on another node (intermittent, not in CI)
	AENV_PAUSE_CYCLES=50 $(BIN)/pytest -q tests/e2e/test_pause.py::test_pause_resume_keeps_files_processes_and_memory
	AENV_E2E_TEMPLATE_BUILDS=50 $(BIN)/pytest -q tests/e2e/test_ram_pool.py
	AENV_TEST_SCALE=1 $(BIN)/pytest -q tests/e2e/test_big_images.py tests/e2e/test_same_bytes.py tests/e2e/test_take_over.py
	AENV_S6_CREATES=10 $(BIN)/pytest -q tests/fleet/test_templates_everywhere.py
	AENV_DRAIN_SANDBOXES=10 $(BIN)/pytest -q tests/e2e/test_drain.py
	AENV_ROLLOUT_VMS=20 $(BIN)/pytest -q -s tests/e2e/test_rollouts.py
	AENV_KILL_POINTS=all $(BIN)/pytest -q tests/reliability/test_resume_kill_points.py
	AENV_ROLLING_SANDBOXES=10 $(BIN)/pytest -q tests/e2e/test_rolling_upgrade.py
	AENV_LONG_COMMAND_S=60 AENV_LONG_COMMAND_CUT_S=10 $(BIN)/pytest -q tests/e2e/test_long_commands.py
	AENV_LAZY_IMAGE_MIB=2048 $(BIN)/pytest -q -s tests/fleet/test_lazy_images.py
	AENV_SNAPSHOT_FORK_CHILDREN=24 $(BIN)/pytest -q -s tests/e2e/test_snapshot_fork.py
	AENV_TEST_SCALE=1 $(BIN)/pytest -q -s tests/fleet/test_layer_fetch.py
	AENV_LAYER_BLOCKS_BASE_MIB=400 AENV_LAYER_BLOCKS_CHILD_MIB=50 $(BIN)/pytest -q -s tests/integration/image/test_layer_blocks.py

test-catalogue: setup ## issue 42's catalogue (real VMs, ~40 min, ~25 GB free disk): 54 registry images (~30 GiB) start one by one on a node with a 3 GiB disk budget, sampled at 10 Hz (the suite runs its reduced form)
	AENV_CATALOGUE=full $(BIN)/pytest -q -s tests/fleet/test_catalogue.py

unit: setup       ## pure tests only: no services, no VMs
	$(BIN)/pytest -q tests/unit

lint:
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m tests.lint.module_size
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

image: setup      ## build (or find in cache) the default `base` guest image
	$(BIN)/python -m workers.node.image build-base

bench: setup
	bash scripts/bench.sh

dist:             ## the release: wheel and sdist of aenv-platform, with dist/SHA256SUMS
	bash scripts/dist.sh

constraints:      ## constraints.txt again from this venv (after a dependency changed)
	$(BIN)/python -m tests.deploy.constraints > constraints.txt.new && mv constraints.txt.new constraints.txt
