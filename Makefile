# The whole set-up is two commands: `make run` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test check lint format typecheck imports lock clean

# Every install takes the versions the suite last passed with (constraints.txt), so a new
# release of a dependency cannot change a fresh clone under its users or CI. `make install
# CONSTRAINTS=` takes the newest releases pyproject.toml allows instead.
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))

# The web UI's browser tests drive Debian's Chromium through its chromedriver: installed
# here when missing and we are root (CI, on a clean clone); elsewhere those tests skip.
BROWSER_PACKAGES := chromium chromium-driver

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@if [ "$$(id -u)" = 0 ] && ! command -v chromedriver >/dev/null && command -v apt-get >/dev/null; then \
		echo "installing $(BROWSER_PACKAGES) for the browser tests"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null; }; \
	fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The CPU build of PyTorch first, by exact version: a range alone would pull CUDA builds.
	$(BIN)/python -m pip install --quiet $(PIN) torch==2.13.0
	$(BIN)/python -m pip install --quiet $(PIN) -e '.[dev]'
	@touch $(STAMP)

## install: create .venv with the platform and everything its tests need
install: $(STAMP)

# Jobs are untrusted code. As root the server runs each team's jobs as an OS user of its
# own; run by anyone else it can only run them as that user, which an operator must ask
# for: `make run` asks for it only then, for the single-user laptop it is.
JOBS_RUN_AS := $(if $(filter 0,$(shell id -u)),team-users,server-user)

## run: start the platform on the embedded default, with its quickstart
# Bytecode is written first: where PYTHONDONTWRITEBYTECODE is set, every process the
# server starts (workers, jobs, the CLI) would otherwise compile what it imports again.
run: install
	@$(BIN)/python -m compileall -q src
	SHAMAL_SCHEDULER__RUN_JOBS_AS=$(JOBS_RUN_AS) $(BIN)/shamal server --quickstart

## check: lint, format check, types, import contracts and the security linter
check: install
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/bandit --quiet --recursive src --severity-level medium

## test: `make check`, then the whole test suite (PostgreSQL and S3 tests included), in
## TEST_WORKERS processes (most tests wait on servers and subprocesses, so more than the cores)
TEST_WORKERS ?= 3
test: check
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

## lock: record the versions in .venv as constraints.txt (after moving one and a green `make test`)
lock:
	$(BIN)/python -m pip freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+cpu$$/\1/' > constraints.txt
	@touch $(STAMP)

## format: apply ruff's fixes and formatting
format: install
	$(BIN)/ruff check --fix src tests
	$(BIN)/ruff format src tests

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
