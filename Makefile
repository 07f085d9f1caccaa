# The README's two commands. Each sets up .venv itself: torch==2.13.0 (the CPU wheel
# that lies on this disk; never a multi-GB CUDA build) when torch is missing, then
# opforge in editable mode with its test extras.
PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.opforge-installed
CLIENTS := $(VENV)/.opforge-clients
DEEPSPEED_SPEC ?= deepspeed==0.19.8
COLOSSALAI_SPEC ?= colossalai==0.5.0
TORCH_SPEC ?= torch==2.13.0
# triton, for the kernels' tests in its interpreter on CPU tensors (tests/kernels/*/test_*_triton.py,
# test_block_sparse_interpreted.py): the version the GPU machines run (with torch 2.11). Where no
# wheel installs, those tests skip (.ci/run makes that a failure: OPFORGE_TEST_REQUIRE_TRITON=1).
TRITON_SPEC ?= triton==3.6.0
INTERP  := $(VENV)/.opforge-triton
# Two pytest-xdist workers, a test file each at a time (its module fixtures built once): the suite's
# compiles and subprocesses use one core each, so 2 cores take about 0.65x of one process's time. The
# builds that need torch's headers still happen once per run (tests/conftest.py: shared_cache). Files go
# out longest first (tests/conftest.py: SLOW_FILES_FIRST), not xdist's default of most tests first, which
# left the few-test, minutes-long client files for the end, one worker idle meanwhile.
TEST_WORKERS ?= 2
PYTEST_ARGS ?= -q -m 'not slow' -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

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

# The real clients the tests drive (tests/clients): DeepSpeed with no op prebuilt, built against the
# torch already here (no build isolation; the installed torch pinned, so pip can't swap it).
$(CLIENTS): $(STAMP)
	$(VPY) -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-pin.txt
	DS_BUILD_OPS=0 $(VPY) -m pip install -q --no-build-isolation -c $(VENV)/torch-pin.txt "$(DEEPSPEED_SPEC)"
	$(VPY) -m pip download -q --no-deps --no-binary :all: -d $(VENV)/clients "$(COLOSSALAI_SPEC)"
	@touch $(CLIENTS)

$(INTERP): $(STAMP)
	@$(VPY) -c "import triton" 2>/dev/null || $(VPY) -m pip install -q "$(TRITON_SPEC)" || \
	  echo "make: no $(TRITON_SPEC) wheel installs here: the kernels' interpreter tests will skip"
	@touch $(INTERP)

test: $(STAMP) $(CLIENTS) $(INTERP)
	$(VPY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VPY) bench/load_times.py

clean-venv:
	rm -rf $(VENV)
