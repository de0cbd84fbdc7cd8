# Two commands on a fresh machine:  `make run` (the main job) and `make test` (the test suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.seer-installed
IOMP    := $(CURDIR)/$(VENV)/lib/libiomp5.so
# Set TORCH_INDEX to install torch 2.13.0+cpu from a CPU wheel index on other machines, e.g.
#   make TORCH_INDEX=https://download.pytorch.org/whl/cpu install
TORCH_INDEX ?=

.PHONY: install system-deps run test test-fast clean

install: $(STAMP)

system-deps:
	@if ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then :; \
	elif [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq libibverbs1) >/dev/null; \
	else echo "Mooncake needs libibverbs1: run 'sudo apt-get install libibverbs1' (Debian/Ubuntu)"; exit 1; fi

$(STAMP): pyproject.toml setup.py seer/dgds/tree/_suffix_core.c | system-deps
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[cpu,dev,watch]"
	# PyPI's torchvision/torchaudio/torchcodec builds break against torch +cpu; vLLM runs without them
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

run: install
	LD_PRELOAD=$(IOMP) $(BIN)/seer-run --sync

test: install
	LD_PRELOAD=$(IOMP) $(BIN)/python -m pytest -q -ra --durations=25

# Everything that starts no vLLM instance (a few minutes)
test-fast: install
	LD_PRELOAD=$(IOMP) $(BIN)/python -m pytest -q -ra -m "not vllm" --durations=10

clean:
	rm -rf $(VENV) runs .pytest_cache
