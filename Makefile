# The two commands a new user needs: `make demo` and `make test`. Each bootstraps .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.installed

.PHONY: demo test lint proto install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The demo also draws its pictures: matplotlib comes with the plots extra.
$(VENV)/.installed-plots: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,plots]'
	touch $@

demo: $(VENV)/.installed-plots
	$(BIN)/rasd-sim --scenario demo --nodes 8 --gpus-per-node 8 --duration-s 30 --seed 7 --out demo-out

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest --ignore=tests/chaos
	# The fault-injection suite (issue #9) runs in its own process: it SIGKILLs servers under
	# in-process gRPC clients and holds thousands of streams, state that must not leak into the rest.
	$(BIN)/python -m pytest tests/chaos
	@echo "make test: all checks passed"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

proto: $(STAMP)
	$(BIN)/python proto/generate.py

clean:
	rm -rf $(VENV) demo-out build *.egg-info
