# The two commands a new user runs: `make demo` and `make test`.
# Both set everything up on a fresh clone (idempotent, quick when done).

VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.kernel-harness-installed
TORCH_PIN   := torch==2.13.0
OP          ?= rms_norm
PYTEST_ARGS ?=

.PHONY: setup system-packages demo test clean-state help

help:
	@echo "make setup                                   create .venv (torch pinned first), install the project and system packages"
	@echo "make demo [OP=rms_norm|softmax|silu_and_mul|linear]  run the procedure end to end"
	@echo "make test                                    run the full test suite"

$(PY):
	python3 -m venv $(VENV)

# torch is installed FIRST and pinned: a bare `torch` requirement would make pip
# resolve a multi-GB CUDA build. The project's own range is satisfied by the pin.
# The `cluster` extra (Ray) is installed too so that `make test` runs tests/test_farm.py.
# The stamp also depends on this Makefile: a changed install line (e.g. a new extra)
# reinstalls once, then the stamp is newer than both and setup is a no-op again.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,cluster]'
	touch $(STAMP)

system-packages:
	@bash tools/install_system_packages.sh

setup: $(STAMP) system-packages

demo: setup
	$(PY) -m kernel_harness.demo --op $(OP)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

clean-state:
	rm -rf trials output demo-run
