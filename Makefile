# Two entry points for a fresh machine with only Python and make:
#   make demo   installs into .venv and runs a local swarm demo on the embedded data
#   make test   installs into .venv and runs the test suite
# On a machine with an NVIDIA GPU, `make install CUDA=1` makes sure torch (pinned in constraints.txt)
# is a CUDA build: it reinstalls the pinned torch when the one installed is not, from pip's own index
# (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL choose it), fails in one line when that index has none, and
# runs `p2p-diloco doctor`.
PYTHON ?= python3
CUDA ?= 0
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install nat-tools bench-sim clean
TORCH_IS_CUDA := $(PY) -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,hf,tokenize,tensorboard,wandb]'
	touch $(STAMP)

install: $(STAMP)
ifeq ($(CUDA),1)
	@$(TORCH_IS_CUDA) || $(PY) -m pip install --quiet -c constraints.txt --force-reinstall torch
	@$(TORCH_IS_CUDA) || { echo "pip's index offers no CUDA build of the pinned torch here: point pip at one" \
	  "(PIP_INDEX_URL or PIP_EXTRA_INDEX_URL) and run make install CUDA=1 again" >&2; exit 1; }
	$(VENV)/bin/p2p-diloco doctor
endif

demo: $(STAMP)
	$(VENV)/bin/p2p-diloco demo

test: $(STAMP) nat-tools
	$(PY) -m pytest $(PYTEST_ARGS)

# tests/integration/test_nat.py builds NAT routers with iptables: as root with apt-get, install it
# when it is missing. Never fails the build: without iptables those tests skip and say why.
nat-tools:
	-@PATH="$$PATH:/usr/sbin:/sbin"; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v iptables >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  timeout 240 apt-get install -y -qq iptables >/dev/null 2>&1 \
	  || { timeout 240 apt-get update -qq >/dev/null 2>&1; timeout 240 apt-get install -y -qq iptables >/dev/null 2>&1; } \
	  || echo "iptables could not be installed: the NAT tests will skip"; fi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
