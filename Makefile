# embshard: `make train` and `make test` set everything up on a fresh machine.
PY      ?= python3.11
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.installed

.PHONY: setup train test bench plan clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-stack.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r requirements-stack.txt
	$(VPY) -m pip install -q --no-deps torchrec==1.8.0
	$(VPY) -m pip install -q -e '.[test]'
	$(VPY) -c "import torch, fbgemm_gpu, torchrec; print('stack ok: torch', torch.__version__, 'torchrec', torchrec.__version__ if hasattr(torchrec, '__version__') else '1.8.0')"
	touch $(STAMP)

# Until training lands (issue 4), the default job is the planner dry run on a shipped workload.
train: $(STAMP)
	$(VENV)/bin/embshard-plan tables=criteo_tb topology.world_size=64 topology.local_world_size=8 topology.hbm_gib=16 out=outputs/plan.json

test: $(STAMP)
	$(VPY) -m pytest -q tests

bench: $(STAMP)
	$(VPY) benchmarks/planner_vs_torchrec.py

clean:
	rm -rf $(VENV) outputs .pytest_cache
