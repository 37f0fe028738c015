# farm: developer entry points. `make setup` makes a fresh machine ready; `make test` is CI.
PYTHON ?= python3
VENV = .venv
VPY = $(VENV)/bin/python
STAMP = $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv setup test lint bench run clean

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

test: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy farm

bench: setup
	@set -e; for f in bench/*.py; do \
		[ -e "$$f" ] || { echo "no benchmarks in bench/"; break; }; \
		echo "== $$f"; $(VPY) "$$f"; \
	done

# The quick start: an embedded local farm (redis + 2 workers with Docker sandboxes) runs the
# example sweep, prints the summary and removes everything it started.
run: setup
	$(VENV)/bin/farm sweep examples/sweep.jsonl -o out/example-results.jsonl --local 2

clean:
	-command -v docker >/dev/null && docker ps -aq --filter label=farm.managed=1 | xargs -r docker rm -f
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
