# treadle: PGXS install of the extension, plus the project's test, demo and bench targets.
#
#   make              build sql/treadle--$(EXTVERSION).sql from sql/src/*.sql
#   make install      install the control file and scripts into $(PG_CONFIG)'s server
#   make test         everything a change can break, from a fresh machine: lint, then every
#                     pgTAP and pytest test on this server, then the plain SQL install's
#   make test-all-versions   pgTAP, the SQL contract and the client tests on PostgreSQL 16,
#                     17 and 18 from packages (make test-pgN: one of them); .ci/run runs
#                     make test, then this
#   make test-fast    the edit-test loop: no slow, browser or subprocess test
#   make test-pgtle   pgTAP, the SQL, client and upgrade tests on treadle registered through pg_tle
#   make test-citus   treadle distributed on a 3-node Citus cluster built from CITUS_SRC (docs/citus.md)
#   make dist         dist/: the plain SQL install (psql -f, no extension files) and the
#                     pg_tle registration script (docs/operations.md#installing)
#   make check-generated   fail when a committed script is not what sql/src builds
#   make release-check     the docs against the code, for a release (CONTRIBUTING.md)
#   make demo         a local cluster, a worker on example jobs and the dashboard (Ctrl-C stops it)
#   make bench        every benchmark in bench/, each against its raw SQL baseline (bench/README.md)

EXTENSION  = treadle
EXTVERSION = $(shell scripts/build-sql version)
SRC        = $(sort $(wildcard sql/src/*.sql))
# the full script of this version, and the upgrade script from each release that has a
# migration in sql/upgrade
# (sql/treadle--0.1.0.sql is the released 0.1.0 script, kept as released)
UPGRADES_FROM = $(patsubst sql/upgrade/%--$(EXTVERSION).sql,%,$(wildcard sql/upgrade/*--$(EXTVERSION).sql))
# the scripts the Python package ships for `treadle install` and `treadle upgrade` (the plain
# install, the plain upgrades, the released ones among them, the pg_tle registration):
# built here and by the package's own build (setup.py), never committed; the stamp stands
# for them all (scripts/build-sql package says which they are)
PLAIN_DIR  = python/src/treadle/plain_sql
PACKAGE_SQL = $(PLAIN_DIR)/.built
EXTENSION_SCRIPTS = sql/$(EXTENSION)--$(EXTVERSION).sql \
             $(foreach v,$(UPGRADES_FROM),sql/$(EXTENSION)--$(v)--$(EXTVERSION).sql)
GENERATED  = $(EXTENSION_SCRIPTS) $(PACKAGE_SQL)
DATA       = $(sort $(wildcard sql/$(EXTENSION)--*.sql) $(EXTENSION_SCRIPTS))

PG_CONFIG ?= pg_config
PGXS      := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
# Without a PostgreSQL build environment only the targets that need none work
# (make demo then runs on pgserver's PostgreSQL 16: scripts/pgserver).
ifneq ($(PGXS),)
include $(PGXS)
endif

all: $(GENERATED)

ifeq ($(PGXS),)
# A server without PGXS (PostgreSQL 17 from npm: scripts/pgserver): install copies the
# control file and the scripts, which is all that PGXS installs of treadle.
install: $(GENERATED)
	dir=$$($(PG_CONFIG) --sharedir)/extension && mkdir -p "$$dir" && cp $(EXTENSION).control $(DATA) "$$dir"/
endif

sql/$(EXTENSION)--$(EXTVERSION).sql: $(SRC) $(EXTENSION).control scripts/build-sql
	scripts/build-sql install > $@

sql/$(EXTENSION)--%--$(EXTVERSION).sql: sql/upgrade/%--$(EXTVERSION).sql $(wildcard sql/upgrade/*.after.sql) $(SRC) $(EXTENSION).control scripts/build-sql
	scripts/build-sql upgrade $* > $@

$(PACKAGE_SQL): $(SRC) $(wildcard sql/upgrade/*.sql) $(wildcard sql/plain/*.sql) $(wildcard sql/$(EXTENSION)--*--*.sql) $(EXTENSION).control scripts/build-sql
	scripts/build-sql package $(PLAIN_DIR) && touch $@

# What a managed server needs: the plain scripts, and the pg_tle registration.
DIST ?= dist
.PHONY: dist
dist: $(PACKAGE_SQL)
	mkdir -p $(DIST)
	cp $(PLAIN_DIR)/*.sql $(DIST)/

# Throwaway clusters and the Python environment live under .build/ (git-ignored).
BUILD   ?= $(CURDIR)/.build
VENV    ?= $(BUILD)/venv
PYTHON  ?= python3

.PHONY: check-generated test test-all-versions test-deps test-pgtap test-plain test-python venv

# $(call same,FILE,BUILD-SQL ARGUMENTS): fail unless FILE is what build-sql writes now
same = scripts/build-sql $(2) | cmp -s - $(1) || { echo "$(1) is stale: run make and commit it" >&2; exit 1; };
check-generated:
	@$(call same,sql/$(EXTENSION)--$(EXTVERSION).sql,install) \
	 $(foreach v,$(UPGRADES_FROM),$(call same,sql/$(EXTENSION)--$(v)--$(EXTVERSION).sql,upgrade $(v)))

# Debian packages the tests need: pgTAP for this server's major version, pg_prove.
test-deps:
	@scripts/install-test-deps $(PG_CONFIG)

# The tests' server: a private copy of PG_CONFIG's under .build (scripts/pgcopy), so that
# `make install` for a test never touches the system's server, and checkouts test side by side.
TEST_PG_CONFIG = $(BUILD)/pg$(shell $(PG_CONFIG) --bindir)/pg_config
.PHONY: test-server
test-server: test-deps
	@scripts/pgcopy $(PG_CONFIG) $(BUILD)/pg >/dev/null

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed $(PACKAGE_SQL)

# The SQL contract: pgTAP (scripts/run-tests runs it first) and these pytest suites run on
# every supported major version and against the plain SQL install as well; the client's
# tests run on every major too. PostgreSQL 14 is not supported: views are security_invoker.
SQL_CONTRACT_TESTS = tests/sql tests/test_install.py tests/upgrade tests/install
OTHER_MAJORS = 16 17 18
OTHER_MAJOR_TESTS = $(SQL_CONTRACT_TESTS) tests/client

# How many pytest tests run at once: pytest-xdist's workers, each with its own template
# database (tests/conftest.py). Most tests wait on the server, a worker or a child process
# more than they compute, so more workers than cores pays; 1 runs each in turn, in one
# process. pgTAP's files run one after another (scripts/run-tests says why).
TEST_JOBS ?= 4
RUN_TESTS = TREADLE_TEST_JOBS=$(TEST_JOBS) VENV=$(VENV) scripts/run-tests

# The one command: tools, lint, install, a throwaway cluster, pgTAP then pytest, cluster
# stopped; then the plain SQL install. The other major versions: make test-all-versions.
# The cluster runs with wal_level logical, so that the logical replication tests run here
# (a subscriber of treadle's tables) instead of being skipped.
test: lint check-generated test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	PGCLUSTER_OPTIONS="-c wal_level=logical" PG_CONFIG=$(TEST_PG_CONFIG) $(RUN_TESTS) $(BUILD)/test-cluster
	$(MAKE) test-plain

# pgTAP, the SQL contract and the client against the plain SQL install, made by a role that has only
# CREATE on its database (scripts/run-tests), on this server.
test-plain: test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	TREADLE_TEST_INSTALL=plain PG_CONFIG=$(TEST_PG_CONFIG) $(RUN_TESTS) \
		$(BUILD)/plain-test-cluster tests/sql tests/client

# pgTAP, the SQL contract, the client and the upgrades against treadle registered through a
# real pg_tle (built from PGTLE_SRC into a second copy of the server, .build/pgtle, which has
# no treadle files: pg_tle refuses to register an extension whose control file exists),
# installed by a role with pgtle_admin and CREATE on its database (scripts/run-tests).
PGTLE_SRC ?= $(CURDIR)/../shared/vendor/pg_tle/pg_tle-1.5.2-src.tar.gz
PGTLE_TESTS = tests/sql tests/client tests/test_install.py tests/upgrade/test_upgrade.py tests/install/test_pgtle.py
.PHONY: test-pgtle
test-pgtle: test-deps venv $(GENERATED)
	pg=$$(scripts/pgtle-server $(PG_CONFIG) $(BUILD)/pgtle "$(PGTLE_SRC)") && \
	TREADLE_TEST_INSTALL=pgtle PGCLUSTER_OPTIONS="-c shared_preload_libraries=pg_tle" PG_CONFIG=$$pg \
		$(RUN_TESTS) $(BUILD)/pgtle-test-cluster $(or $(T),$(PGTLE_TESTS))

# treadle on a real Citus cluster (docs/citus.md): Citus built from CITUS_SRC into a copy of
# the server (.build/citus/pg: scripts/citus-build; skipped once built, or where the server
# has Citus's packages), a coordinator and two worker nodes (scripts/citus-cluster),
# treadle created and distributed, then pgTAP and tests/citus (scripts/citus-tests); the
# cluster stops at the end. Optional for contributors: make test does not need Citus.
CITUS_SRC ?= $(CURDIR)/../shared/vendor/citus/citus-13.2.2-src.tar.gz
.PHONY: test-citus
test-citus: test-deps venv $(GENERATED)
	pg=$$(scripts/citus-build $(PG_CONFIG) $(BUILD)/citus/pg "$(CITUS_SRC)") && \
	$(MAKE) install PG_CONFIG=$$pg && \
	$(if $(PGTAP),TREADLE_PGTAP="$(PGTAP)") PG_CONFIG=$$pg VENV=$(VENV) scripts/citus-tests $(BUILD)/citus/test-cluster $(T)

# Another major version from a wheel (scripts/pgserver), with pgTAP copied from the
# system server's: make test-pg16, make test-pg17, make test-pg18.
test-pg%: test-deps venv
	pg=$$(PYTHON=$(PYTHON) scripts/pgserver --major $* pgtap $(PG_CONFIG)) && \
	$(MAKE) install PG_CONFIG=$$pg && \
	PG_CONFIG=$$pg $(RUN_TESTS) $(BUILD)/pg$*-test-cluster $(OTHER_MAJOR_TESTS)

# The version matrix: pgTAP, the SQL contract and the client on every other major version
# (.ci/run runs it after make test, so CI proves PostgreSQL 15 to 18).
test-all-versions: $(foreach m,$(OTHER_MAJORS),test-pg$(m))

# The whole suite, not only the contract, on every other major version (not run by CI).
.PHONY: test-all-versions-full
test-all-versions-full: test-deps venv
	for m in $(OTHER_MAJORS); do \
		pg=$$(PYTHON=$(PYTHON) scripts/pgserver --major $$m pgtap $(PG_CONFIG)) && \
		$(MAKE) install PG_CONFIG=$$pg && \
		PG_CONFIG=$$pg $(RUN_TESTS) $(BUILD)/pg$$m-all-cluster tests || exit 1; \
	done

# Against a database that has pgTAP available: make test-pgtap DATABASE_URL=...
test-pgtap:
	pg_prove --ext .sql -d "$(DATABASE_URL)" pgtap/

test-python: venv
	cd $(CURDIR) && $(VENV)/bin/pytest -q -n $(TEST_JOBS) tests

# The docs against the code, for a release (CONTRIBUTING.md's checklist): what the docs
# say is missing is listed and still missing, the versions they print are this one or
# released ones, and the generated scripts are current. Seconds, on its own cluster.
.PHONY: release-check
release-check: check-generated test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	TREADLE_PGTAP="" PG_CONFIG=$(TEST_PG_CONFIG) VENV=$(VENV) \
		scripts/run-tests $(BUILD)/release-check-cluster -q tests/docs/test_release_check.py

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
lint: test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	PG_CONFIG=$(TEST_PG_CONFIG) VENV=$(VENV) scripts/lint $(BUILD)/lint-cluster

# The edit-test loop: pgTAP, then pytest without the tests marked slow, browser or
# subprocess, on one throwaway cluster.
.PHONY: test-fast
test-fast: test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	PG_CONFIG=$(TEST_PG_CONFIG) $(RUN_TESTS) $(BUILD)/test-fast-cluster \
		-m "not slow and not browser and not subprocess" tests

# What an edit touches, on its own cluster: make test-only T="tests/sql/test_x.py -k name"
# (pytest arguments), PGTAP="pgtap/070_workflows.sql" (pgTAP files; none unless named).
.PHONY: test-only
test-only: test-server venv
	$(MAKE) install PG_CONFIG=$(TEST_PG_CONFIG)
	TREADLE_PGTAP="$(PGTAP)" PG_CONFIG=$(TEST_PG_CONFIG) VENV=$(VENV) \
		scripts/run-tests $(BUILD)/test-only-cluster $(or $(T),--collect-only -q tests/client/test_version.py)
