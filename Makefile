# The README's two commands. Each sets up .venv itself: torch==2.13.0 (the CPU wheel
# that lies on this disk; never a multi-GB CUDA build) when torch is missing, then
# opforge in editable mode with its test extras.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.opforge-installed
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?= -q -m 'not slow' --durations=15

.PHONY: demo test bench venv clean-venv

venv: $(STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(VPY)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q -e ".[test]"
	@touch $(STAMP)

demo: $(STAMP)
	$(VPY) examples/demo.py

test: $(STAMP)
	$(VPY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VPY) bench/load_times.py

clean-venv:
	rm -rf $(VENV)
