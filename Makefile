# The two commands of the README: `make serve` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup serve test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch 2.13.0 first: pip takes the CPU build from this machine kind's local disk
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/livesight serve $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/livesight bench ttft $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
