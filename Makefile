# Two entry points for users: `make demo` and `make test` (README.md).
# The environment lives in .venv at the repo root and is rebuilt when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ABPS := $(VENV)/bin/abps
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_out

.PHONY: install test test-cpus lint demo bench clean ui

install: $(STAMP)

FMNIST_DIR := /usr/share/datasets/fashion-mnist

$(STAMP): pyproject.toml
	@# Fashion-MNIST (real data for the image benchmarks) comes from Debian's dataset-fashion-mnist.
	@test -d $(FMNIST_DIR) || { command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) ; } || \
	  echo "warning: could not install dataset-fashion-mnist (needs root); image benchmarks need it"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile tests

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

ui: $(STAMP)
	$(ABPS) ui --port 5000

clean:
	rm -rf $(VENV) $(DEMO_DIR)
