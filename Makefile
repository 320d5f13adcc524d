# Two entry points for users: `make demo` and `make test` (README.md); `make docs` builds the site.
# The environment lives in .venv at the repo root and is rebuilt when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ABPS := $(VENV)/bin/abps
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_out

.PHONY: install test test-cpus lint demo bench clean ui docs

install: $(STAMP)

FMNIST_DIR := /usr/share/datasets/fashion-mnist

$(STAMP): pyproject.toml
	@# Fashion-MNIST (real data for the image benchmarks) comes from Debian's dataset-fashion-mnist.
	@test -d $(FMNIST_DIR) || { command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) ; } || \
	  echo "warning: could not install dataset-fashion-mnist (needs root); image benchmarks need it"
	@# headless Chromium for the MLflow UI browser test (driven by Playwright, never `playwright install`)
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) ; } || \
	  echo "warning: could not install chromium (needs root); the MLflow UI browser test needs it"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 tests

# ruff and the layers contract (pyproject.toml [tool.ruff], [tool.importlinter])
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# the numerically sensitive tests as an AVX2 machine, the eager step and a machine with no compiler
test-cpus: $(STAMP)
	bash scripts/test_cpus.sh $(PY)

demo: $(STAMP)
	bash scripts/demo.sh $(DEMO_DIR)

bench: $(STAMP)
	$(PY) -m benchmarks.run

# the documentation site in strict mode (a broken link, a missing page or a stale path fails) -> site/index.html
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 ABPS_STATE=$$(mktemp -d)/state.json $(VENV)/bin/mkdocs build --strict --site-dir site

ui: $(STAMP)
	$(ABPS) ui --port 5000

# the ETL's chartevents cache lives outside the repo ($$ABPS_CACHE_DIR, else ~/.cache/abps)
# this clone's outputs only: the per-user caches (~/.cache/abps) serve every clone; `abps cache clear` removes them
clean:
	rm -rf $(VENV) $(DEMO_DIR) site
