# treadle: PGXS install of the extension, plus the project's test, demo and bench targets.
#
#   make              build sql/treadle--$(EXTVERSION).sql from sql/src/*.sql
#   make install      install the control file and scripts into $(PG_CONFIG)'s server
#   make test         everything, from a fresh machine: tools, a throwaway cluster, all tests
#   make test-pg16    pgTAP and the SQL-level tests on PostgreSQL 16 from pgserver (make test runs it)
#   make check-generated   fail when the committed script is not what sql/src builds
#   make demo         a local cluster, a worker on example jobs and the dashboard (Ctrl-C stops it)
#   make bench        every benchmark in bench/, each against its raw SQL baseline (bench/README.md)

EXTENSION  = treadle
EXTVERSION = $(shell sed -n "s/^default_version[[:space:]]*=[[:space:]]*'\([^']*\)'.*/\1/p" $(EXTENSION).control)
SRC        = $(sort $(wildcard sql/src/*.sql))
# the full script of this version, and the upgrade script from each release before it
# (sql/treadle--0.1.0.sql is the released 0.1.0 script, kept as released)
UPGRADES_FROM = 0.1.0
GENERATED  = sql/$(EXTENSION)--$(EXTVERSION).sql \
             $(foreach v,$(UPGRADES_FROM),sql/$(EXTENSION)--$(v)--$(EXTVERSION).sql)
DATA       = $(sort $(wildcard sql/$(EXTENSION)--*.sql) $(GENERATED))

PG_CONFIG ?= pg_config
PGXS      := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
# Without a PostgreSQL build environment only the targets that need none work
# (make demo then runs on pgserver's PostgreSQL 16: scripts/pgserver).
ifneq ($(PGXS),)
include $(PGXS)
endif

all: $(GENERATED)

sql/$(EXTENSION)--$(EXTVERSION).sql: $(SRC) $(EXTENSION).control scripts/build-sql
	scripts/build-sql install > $@

sql/$(EXTENSION)--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql $(wildcard sql/upgrade/*.after.sql) $(SRC) $(EXTENSION).control scripts/build-sql
	scripts/build-sql upgrade $* > $@

# Throwaway clusters and the Python environment live under .build/ (git-ignored).
BUILD   ?= $(CURDIR)/.build
VENV    ?= $(BUILD)/venv
PYTHON  ?= python3

.PHONY: check-generated test test-deps test-pg16 test-pgtap test-python venv

check-generated:
	@scripts/build-sql install | cmp -s - sql/$(EXTENSION)--$(EXTVERSION).sql \
		|| { echo "sql/$(EXTENSION)--$(EXTVERSION).sql is stale: run make and commit it" >&2; exit 1; }
	@for v in $(UPGRADES_FROM); do scripts/build-sql upgrade $$v | cmp -s - sql/$(EXTENSION)--$$v--$(EXTVERSION).sql \
		|| { echo "sql/$(EXTENSION)--$$v--$(EXTVERSION).sql is stale: run make and commit it" >&2; exit 1; }; done

# Debian packages the tests need: pgTAP for this server's major version, pg_prove.
test-deps:
	@scripts/install-test-deps $(PG_CONFIG)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The one command: tools, install, a throwaway cluster, pgTAP then pytest, cluster stopped.
test: lint check-generated test-deps venv
	$(MAKE) install PG_CONFIG=$(PG_CONFIG)
	PG_CONFIG=$(PG_CONFIG) VENV=$(VENV) scripts/run-tests $(BUILD)/test-cluster
	$(MAKE) test-pg16

# A second major version: PostgreSQL 16 from the pgserver wheel (scripts/pgserver), with
# pgTAP copied from the system server's; pgTAP and the SQL-level pytest suites.
test-pg16: test-deps venv
	pg16=$$(PYTHON=$(PYTHON) scripts/pgserver pgtap $(PG_CONFIG)) && \
	$(MAKE) install PG_CONFIG=$$pg16 && \
	PG_CONFIG=$$pg16 VENV=$(VENV) scripts/run-tests $(BUILD)/pg16-test-cluster tests/sql tests/test_install.py tests/client

# Against a database that has pgTAP available: make test-pgtap DATABASE_URL=...
test-pgtap:
	pg_prove --ext .sql -d "$(DATABASE_URL)" pgtap/

test-python: venv
	cd $(CURDIR) && $(VENV)/bin/pytest -q tests

# The newcomer's first command: scripts/demo says what it sets up.
.PHONY: demo
demo:
	PG_CONFIG=$(PG_CONFIG) VENV=$(VENV) scripts/demo

# Every benchmark scenario against a throwaway durable cluster, about ten minutes;
# they print tables beside their raw SQL baselines and never fail on a timing.
.PHONY: bench
bench: venv
	$(MAKE) install PG_CONFIG=$(PG_CONFIG)
	$(VENV)/bin/python bench/run_all.py

# Static checks: ruff and mypy --strict over the Python scripts/lint lists, plpgsql_check
# over every function in schema treadle (scripts/lint says which checks are on).
.PHONY: lint
lint: test-deps venv
	$(MAKE) install PG_CONFIG=$(PG_CONFIG)
	PG_CONFIG=$(PG_CONFIG) VENV=$(VENV) scripts/lint $(BUILD)/lint-cluster

# The edit-test loop: pgTAP, then pytest without the tests marked slow, browser or
# subprocess, on one throwaway cluster.
.PHONY: test-fast
test-fast: test-deps venv
	$(MAKE) install PG_CONFIG=$(PG_CONFIG)
	PG_CONFIG=$(PG_CONFIG) VENV=$(VENV) scripts/run-tests $(BUILD)/test-fast-cluster \
		-m "not slow and not browser and not subprocess" tests
