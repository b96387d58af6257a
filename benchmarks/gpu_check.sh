#!/usr/bin/env bash
# GPU check on a machine with one NVIDIA GPU (e.g. the H200 the device tool lends), from anywhere:
#   OUT=/tmp/gpu bash benchmarks/gpu_check.sh      # device tool: run("bash benchmarks/gpu_check.sh", carry=[".whl"])
# 1. The stack: what the machine's python3 lacks is installed from the wheels in .whl/ (carried;
#    nothing can be downloaded there) into /tmp/site, never over its torch; then checked on the GPU.
# 2. embshard-calibrate device=cuda on the one GPU: kernels only (collectives and multi-rank plans
#    need one GPU per rank, so communication keeps the cuda datasheet) -> $OUT/h200_profile.yaml.
# 3. The runtime on one nccl rank vs one gloo rank (tests/calibrate/test_cuda_rank.py), and
#    embshard-plan measure=true on one cuda rank with that profile.
# Logs: $OUT/gpu_check.log (summary), calibrate.log, runtime_cuda_test.log, plan_measure.log.
# Wheels, fetched here for python 3.12 (the machine's python3):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl NAME==VERSION
# for hydra-core omegaconf antlr4-python3-runtime==4.9.3 torchrec==1.8.0 tensordict pyvers, and
# fbgemm-gpu built for the machine's torch (2.11+cu130 when last seen). That CUDA wheel is about
# 500 MB (STACK.md) and the device tool carries 64 MiB: without fbgemm-gpu there, step 1 stops.
set -uo pipefail
: "${OUT:?set OUT to the folder for the results}"
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$OUT"
PY=${PYTHON:-python3}
log() { echo "$*" | tee -a "$OUT/gpu_check.log"; }
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY - >>"$OUT/gpu_check.log" 2>&1 <<'EOF'
import torch, fbgemm_gpu, torchrec, hydra  # noqa: F401
import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401
assert torch.cuda.is_available(), "torch sees no GPU"
assert torch.ops.fbgemm.asynchronous_complete_cumsum(torch.ones(3, dtype=torch.int64, device="cuda")).is_cuda
print(f"stack: torch {torch.__version__}, fbgemm_gpu {fbgemm_gpu.__version__}, torchrec {torchrec.__version__}, "
      f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
EOF
then
  log "FAILED: the stack does not import with CUDA (see above); carry the wheels named at the top of this script"; exit 2
fi
status=0
step() {  # name, log file, command...
  local name=$1 file=$2; shift 2
  "$@" >"$OUT/$file" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then log "ok: $name"; else status=1; log "FAILED: $name (exit $rc; $OUT/$file)"; fi
}
step "embshard-calibrate device=cuda" calibrate.log timeout 420 $PY -m embshard.calibrate.cli profile=h200_profile device=cuda \
  out_dir="$OUT" data_out="$OUT/h200_data.json" topology.world_size=8 topology.local_world_size=8 topology.hbm_gib=139 timeout_s=400
step "runtime: one nccl rank on the GPU vs one gloo rank on the CPU" runtime_cuda_test.log \
  timeout 240 $PY -m pytest -q -p no:cacheprovider tests/calibrate/test_cuda_rank.py
mkdir -p /tmp/gpu_check/topology && cp "$OUT/h200_profile.yaml" /tmp/gpu_check/topology/ 2>/dev/null
step "embshard-plan measure=true on one cuda rank" plan_measure.log timeout 240 $PY -m embshard.plan_cli --config-dir /tmp/gpu_check \
  topology=h200_profile topology.world_size=1 topology.local_world_size=1 tables=criteo_small out=/tmp/gpu_check/plan.json measure=true
exit $status
