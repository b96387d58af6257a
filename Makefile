# embshard: `make train` and `make test` set everything up on a fresh machine.
PY      ?= python3.11
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: setup train test bench plan clean

setup: $(STAMP)

# The development install (README "Install"): every layer on CPU, editable. torchrec goes in
# without its dependencies (its metadata pulls the CUDA fbgemm-gpu; the cpu extra has the rest).
$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[cpu,serve,test]'
	$(VPY) -m pip install -q --no-deps torchrec==1.8.0
	$(VPY) -c "import torch, fbgemm_gpu, torchrec; print('stack ok: torch', torch.__version__, 'torchrec', torchrec.__version__ if hasattr(torchrec, '__version__') else '1.8.0')"
	touch $(STAMP)

# The default job: DLRM on 2 local CPU ranks, synthetic Criteo-like data, 300 steps (a few minutes).
train: $(STAMP)
	$(VENV)/bin/embshard-train launcher.nproc=2

test: $(STAMP)
	$(VPY) -m pytest -q --durations=25 tests

bench: $(STAMP)
	$(VPY) benchmarks/planner_vs_torchrec.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
