# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# DATASTORE=legacy (the default for run and test: the legacy Datastore emulator, which enforces index.yaml) or
# DATASTORE=firestore (the Firestore emulator in Datastore mode, what App Engine apps use today). `make bench` measures
# both side by side unless DATASTORE names one. CACHE=memcached (the default, the talk's) or CACHE=redis (Debian's
# redis-server, standing in for Memorystore for Valkey) picks the cache the same way. LATENCY=production (a regional
# database) or LATENCY=multi-region (nam5-like Commits) makes every Datastore RPC, cache call, task creation and task
# delivery wait a production round trip from published measurements (core/production_latency.py): Datastore RPCs in the
# stand-in devstack starts in front of the emulator (devstack/standin.py), where one entity also takes production's one
# write a second; `make bench` measures both profiles side by side unless LATENCY names one (LATENCY=none: the bare
# emulator). LATENCY_SEED=<n> repeats a run's draws.
PYTHON ?= python3
export DATASTORE CACHE LATENCY
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` installs what serving needs (requirements.txt, which devstack's imports are within), and
# everything else the rest (requirements-dev.txt: browsers' tests, charts, Locust, linters), so a fresh clone serves
# its first page without waiting for the test tools.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test lint bench bench-beam load screenshots deploy clean seed guarantees mutants

$(RUN_STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

## run: start the emulator (data kept in .devstack/; PERSIST=no: in memory) and the cache, seed demo content when
## empty, serve the web UI
run: $(RUN_STAMP)
	$(PY) -m devstack run

## test: the lint below, then the whole suite on a fresh in-memory emulator and memcached, started and stopped by the tests
test: lint
	$(PY) -m pytest

## lint: ruff (style, pyproject.toml), import-linter (the layout's dependency rules) and mypy (every function of the app typed)
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy

## guarantees: break each guarantee's code on purpose in a scratch copy (tests/mutations/*.toml), run only its named
## tests, report killed / survived (tests/mutations/run.py; ARGS="--write" fills docs/guarantees.md's last column)
guarantees: $(STAMP)
	$(PY) -m tests.mutations.run $(ARGS)

## mutants: mutmut (requirements-dev.txt) over the modules devstack/mutants.py lists, or MODULES="comments/bookmarks.py
## ..." (TESTS="tests/..." for other test files), on DATASTORE's emulator (started once, shared by every mutant) and
## CACHE, one worker, in a scratch copy (.devstack/mutants/); docs/mutants.md written from it. Not part of test or CI
mutants: $(STAMP)
	$(PY) -m devstack.mutants $(if $(MODULES),--modules "$(MODULES)") $(if $(TESTS),--tests "$(TESTS)") $(ARGS)

## bench: every benchmark under bench/, results in bench/results/
bench: $(STAMP)
	$(PY) -m bench

## bench-beam: bench/mapper.py on both backends, bare and under both profiles, with Apache Beam's own pipeline timed
## beside its baseline in every column (under a profile through the same stand-in as the app, devstack/standin.py;
## Beam in .venv-beam, from bench/requirements-beam.txt: about 5 minutes to install the first time)
BEAM_STAMP := .venv-beam/.installed
$(BEAM_STAMP): bench/requirements-beam.txt
	test -x .venv-beam/bin/python || $(PYTHON) -m venv .venv-beam
	.venv-beam/bin/python -m pip install --quiet -r bench/requirements-beam.txt
	touch $(BEAM_STAMP)

bench-beam: $(STAMP) $(BEAM_STAMP)
	$(PY) -m bench.mapper --latency all --beam-python .venv-beam/bin/python $(BENCH_ARGS)

## load: Locust against URL (default: make run's http://127.0.0.1:8080), SCENARIO=counters|frontpage|comments|all,
## bounded (LOAD_ARGS="--users 16 --seconds 15 --rounds 3"); report in bench/results/load.md (bench/load.py)
load: $(STAMP)
	$(PY) -m bench.load $(if $(URL),--url "$(URL)") $(if $(SCENARIO),--scenario "$(SCENARIO)") $(LOAD_ARGS)

## screenshots: a PNG of each page under docs/ (its own stack with the demo content, Debian's headless Chromium)
screenshots: $(STAMP)
	$(PY) -m devstack.screenshots

## deploy: the deploy files checked as gcloud reads them (devstack/deployfiles.py); the APIs enabled; the preflight
## (devstack/preflight.py: the project's database, app, connector, cache, queue, roles, read through gcloud, before
## any upload); the session key's secret in Secret Manager (made once); the task queue created or updated through the
## Cloud Tasks API from queue.yaml (which is never uploaded); the indexes (waiting until every one is READY); then the
## app, and cron.yaml when there is one (docs/deploy.md; needs `gcloud auth login` and `gcloud config set project`)
deploy: $(STAMP)
	$(PY) -m devstack.deployfiles
	$(PY) -m devstack.preflight --enable-apis
	$(PY) -m devstack.preflight
	$(PY) -m devstack.deployfiles --secret-key
	$(PY) -m devstack.preflight --queue
	gcloud app deploy index.yaml
	$(PY) -m devstack.deployfiles --wait-for-indexes
	gcloud app deploy app.yaml $(wildcard cron.yaml)

clean:
	rm -rf $(VENV) .venv-* .devstack .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
