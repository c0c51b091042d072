# Better Compute: a fresh machine needs only Python 3.11 and make; everything else lands in .venv.
#
#   make dev     run the control plane locally (embedded PostgreSQL unless BETTERCOMPUTE_DATABASE_URL is set)
#   make test    lint, type-check, check import contracts, run the tests
#   make lint    the checks without the tests        make fmt     format and apply safe lint fixes
#   make bench   every benchmark, one table           make clean   remove caches and build output (distclean: + .venv)
#   make test-e2e    the slow end-to-end suites make test leaves out (QEMU boots; CI runs them as a phase)
#   make test-embedded   pytest on the embedded PostgreSQL (URL unset), the subset CI runs there
#   make protos  regenerate the wire code from protos/ (make test checks it did not drift)
#   make docs    regenerate docs/api.md and the CLI's command catalog from the method registry (make test checks both)
#   make site    build the documentation site (mkdocs.yml) into site/ (make test builds it with --strict)
#   make schema  regenerate bettercompute_store_pg/schema.sql from the migrations (make test checks it is not stale)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; pyproject.toml being newer means the dependencies may have changed.
STAMP := $(VENV)/.bettercompute-installed

SHELL := /bin/bash
.DEFAULT_GOAL := test

# Bytecode is cached (in __pycache__, ignored by git) even where the environment says not to: without it every
# process the tests start compiles the project's sources again, and pytest rewrites every test module's asserts
# again in each worker (measured: collection 11 s -> 4.5 s of CPU per worker, a `serve` start 1.3 s -> 0.95 s).
unexport PYTHONDONTWRITEBYTECODE

# $(call step,NAME,COMMAND): run COMMAND and print how long it took, so a slow or failing check stands out in CI logs.
define step
	@echo "==> $(1)"; started=$$(date +%s%N); $(2); rc=$$?; \
	echo "<== $(1): $$(( ($$(date +%s%N) - started) / 1000000 )) ms, exit $$rc"; exit $$rc
endef

.PHONY: dev install test test-e2e test-embedded test-busy test-reliability lint check-ruff check-format check-types check-imports check-protos protos check-docs docs check-site site check-schema schema pytest fmt bench clean distclean

$(BIN)/python:
	@# Debian's python3 has no ensurepip without python3-venv; a half-made .venv would fool the next run.
	@echo "==> create $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
		echo "could not create $(VENV) with $(PYTHON); on Debian/Ubuntu install python3-venv" >&2; exit 1; }

$(STAMP): pyproject.toml | $(BIN)/python
	$(call step,install,$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev]')
	@touch $@

install: $(STAMP)

dev: $(STAMP)
	$(BIN)/better-compute dev

test: lint pytest

lint: check-ruff check-format check-types check-imports check-protos check-docs check-site check-schema

check-ruff: $(STAMP)
	$(call step,ruff check,$(BIN)/ruff check .)

check-format: $(STAMP)
	$(call step,ruff format --check,$(BIN)/ruff format --check .)

check-types: $(STAMP)
	$(call step,mypy,$(BIN)/mypy)

check-imports: $(STAMP)
	$(call step,lint-imports,$(BIN)/lint-imports)

# The generated wire code must be what protos/ generate with the pinned compiler; `make protos` regenerates it.
check-protos: $(STAMP)
	$(call step,protos,$(BIN)/python -m bettercompute_proto._regenerate --check)

protos: $(STAMP)
	$(BIN)/python -m bettercompute_proto._regenerate

# The API reference and the client commands' catalog (bettercompute_cli/catalog.json) are generated from the method
# registry; a method added or changed without `make docs` fails here.
check-docs: $(STAMP)
	$(call step,api docs,$(BIN)/python -m bettercompute_cli._apidoc --check)
	$(call step,cli catalog,$(BIN)/python -m bettercompute_cli._catalog --check)

docs: $(STAMP)
	$(BIN)/python -m bettercompute_cli._apidoc
	$(BIN)/python -m bettercompute_cli._catalog

# The docs site, built with --strict: a link to a page or an anchor that does not exist, or a page missing from the
# nav, fails (mkdocs.yml's `validation`). It builds offline. Material's notice about MkDocs 2 is silenced: it is
# printed on every build and says nothing about this site. Not --quiet: it hides the very warnings --strict counts.
MKDOCS = NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
check-site: $(STAMP)
	$(call step,docs site,{ out=$$(mktemp -d); $(MKDOCS) --site-dir "$$out"; rc=$$?; rm -rf "$$out"; (exit $$rc); })

site: $(STAMP)
	$(MKDOCS) --site-dir site

# schema.sql is the schema the migrations make, dumped from the catalog of a scratch schema they migrated (on
# BETTERCOMPUTE_DATABASE_URL, else on an embedded server); a migration added or changed without `make schema` fails here.
check-schema: $(STAMP)
	$(call step,schema.sql,$(BIN)/python -m bettercompute_cli._schemadump --check)

schema: $(STAMP)
	$(BIN)/python -m bettercompute_cli._schemadump

# `make test` runs the test files side by side (pytest-xdist), a file's tests on one worker so that what a module
# starts once (PgBouncer, a served control plane) starts once; tests/conftest.py starts the slowest files first.
# Every test has a schema of its own, and much of a test's time is spent waiting on PostgreSQL or a subprocess, so
# four workers beat two cores' worth (they keep both cores busy; with two, the waits on processes and leases leave them
# idle). The slow end-to-end suites (marker e2e: VMs booted under QEMU's emulation, a dead worker's claim waited
# out, whole deployments of processes, schemathesis) are left to `make test-e2e`, which CI runs as a phase of its
# own, so the whole suite still runs there.
# Measured on two cores (Dec 2026): about 2,400 tests in 5 to 6 minutes of pytest, the machine's speed that hour
# deciding.
# PYTEST_WORKERS=0 runs them one after another, in this process.
PYTEST_WORKERS ?= 4
# pytest exits 5 when it collected nothing: a green run that tested nothing must not pass, and should say why.
RUN_PYTEST = $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile $(1) $(PYTEST_ARGS) \
	|| { rc=$$?; [ $$rc -ne 5 ] || echo "pytest collected no tests" >&2; (exit $$rc); }

pytest: $(STAMP)
	$(call step,pytest,$(call RUN_PYTEST,-m "not e2e"))

# The slow end-to-end suites on their own (they skip, or fail under CI's BETTERCOMPUTE_REQUIRE_PXE/_VM, without
# root, QEMU, dnsmasq and iPXE).
test-e2e: $(STAMP)
	$(call step,pytest (end-to-end),$(call RUN_PYTEST,-m e2e))

# The embedded PostgreSQL path: the URL unset, every test that hands it on, and one use of every fixture.
test-embedded: $(STAMP)
	$(call step,pytest (embedded PostgreSQL),env -u BETTERCOMPUTE_DATABASE_URL $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --fixture-cover $(PYTEST_ARGS))

# The tests that start real processes (serve, dev, bcd, a fleet, worker processes, the quickstart) once more on a
# busy machine: two processes spin on the two cores for the whole run (at the tests' own priority), and every
# deadline is stretched by BETTERCOMPUTE_TEST_SLOWDOWN (tests/_timing.py). A test that passes only on an idle
# machine fails here. BUSY_FILES names the files; BUSY_HOGS how many spinners.
BUSY_FILES ?= tests/integration/cli/test_serve.py tests/integration/cli/test_worker_roles.py \
	tests/integration/docs/test_quickstart.py tests/integration/sim/test_sim.py tests/integration/worker/test_processes.py
BUSY_HOGS ?= 2
test-busy: $(STAMP)
	@hogs=(); for _ in $$(seq $(BUSY_HOGS)); do $(BIN)/python -c 'while True: pass' & hogs+=($$!); done; \
	trap 'kill $${hogs[*]} 2>/dev/null' EXIT; \
	echo "==> pytest (busy: $(BUSY_HOGS) spinners, deadlines x3)"; started=$$(date +%s%N); \
	BETTERCOMPUTE_TEST_SLOWDOWN=3 $(BIN)/pytest -n 2 --dist loadfile $(PYTEST_ARGS) $(BUSY_FILES); rc=$$?; \
	echo "<== pytest (busy): $$(( ($$(date +%s%N) - started) / 1000000 )) ms, exit $$rc"; exit $$rc

# The deployed control plane under load and faults (tests/reliability): its own PostgreSQL, PgBouncer, 2 api,
# 2 gateway and 3 worker processes, bcd sim fleets, Prometheus; about five minutes. CI runs it as a phase of its own.
test-reliability: $(STAMP)
	$(call step,pytest (reliability),$(BIN)/pytest -m reliability -s tests/reliability $(PYTEST_ARGS))

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Every benchmark, one table of each figure beside its baseline (bench/run.py; about 10 minutes on two cores).
# BENCH_ARGS passes options on: make bench BENCH_ARGS="--only worker,claims", "--quick", "--write".
bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache build dist site *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
