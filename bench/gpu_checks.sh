#!/usr/bin/env bash
# The replay checks a GPU machine is for (issue 18), in order of what they prove, each stage bounded:
#   1. cross-device exactness: det64 transcripts recorded on CUDA and on the CPU from one seed have
#      byte-identical checkpoints; the CUDA recording verifies on CUDA and on the CPU, the CPU one on CUDA;
#   2. tests/replay, CUDA leg included (run without Django: --confcutdir keeps tests/conftest.py out);
#   3. bench/replay.py --device $gpu --json (step times, ratios, syncs, ops, peaks);
#   4. GPT-2 small at block 1024 recorded on CUDA, verified on CUDA and on the CPU;
#   5. profile: where a step's time goes per precision (bench/replay.py --profile), kernels by device time.
#
#   bash bench/gpu_checks.sh OUT_DIR [STAGES...]    # stages: exact tests bench gpt2 profile (default: all)
#   TESTS_PATHS="tests/replay/training/test_cuda_graphs.py ..." narrows the tests stage.
#
# Needs a python3 with torch (CUDA), numpy, safetensors, tqdm, pytest, hypothesis and PyNaCl.
set -u
out=${1:?usage: gpu_checks.sh OUT_DIR [STAGES...]}
shift
stages=${*:-exact tests bench gpt2 profile}
mkdir -p "$out"
py=${PYTHON:-python3}
gpu=${GPU:-cuda}  # GPU=cpu tries the script's plumbing on a machine without one
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.txt"; }

has() { [[ " $stages " == *" $1 "* ]]; }

{
  nvidia-smi -L
  $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  nproc
} >>"$out/summary.txt" 2>&1

verify() {  # verify DIR DEVICE: prints the verdict line
  local dir=$1 device=$2
  timeout "${VERIFY_TIMEOUT:-240}" $py -m replay verify "$dir" --claims "$dir/claims.json" --segments 100 \
    --device "$device" --json >"$dir.verify-$device.json" 2>>"$out/exact.log"
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], d["verdict"], d.get("device"), d.get("torch"), d.get("segments_replayed"), d["reasons"][:2])' \
    "$dir.verify-$device.json" 2>&1 | tee -a "$out/summary.txt"
}

exact_arch() {  # exact_arch WORK ARCH: record on both devices, compare, verify across
  local work=$1 arch=$2
  for device in $gpu cpu; do
    OMP_NUM_THREADS=4 timeout "${RECORD_TIMEOUT:-240}" $py -m replay record --arch "$arch" --steps 12 --checkpoint-interval 4 --seed 7 \
      --device "$device" --out "$work/$arch-$device" >>"$out/exact.log" 2>&1 || log "record $arch $device FAILED"
  done
  if diff -r -q "$work/$arch-$gpu/checkpoints" "$work/$arch-cpu/checkpoints" >>"$out/exact.log" 2>&1; then
    log "$arch: checkpoints recorded on cuda and cpu are byte-identical ($(ls "$work/$arch-cpu/checkpoints" | wc -l) files)"
  else
    log "$arch: checkpoints DIFFER between cuda and cpu"
  fi
  OMP_NUM_THREADS=4 verify "$work/$arch-$gpu" $gpu
  OMP_NUM_THREADS=4 verify "$work/$arch-$gpu" cpu
  OMP_NUM_THREADS=4 verify "$work/$arch-cpu" $gpu
}

if has exact; then
  log "exact: record on cuda and cpu, compare checkpoints, verify across (the three architectures side by side)"
  work=$(mktemp -d)
  for arch in mlp cnn gpt; do
    exact_arch "$work" "$arch" &
  done
  wait
fi

if has tests; then
  log "tests: tests/replay"
  # -v: each test's name as it ends, so a run cut by the timeout still names its failures
  timeout "${TESTS_TIMEOUT:-300}" $py -m pytest -p no:cacheprovider --confcutdir=tests/replay ${TESTS_PATHS:-tests/replay} -v \
    ${TESTS_ARGS:-} \
    -W ignore::pytest.PytestConfigWarning >"$out/tests.log" 2>&1
  log "tests rc=$? $(tail -1 "$out/tests.log")"
fi

if has bench; then
  log "bench: bench/replay.py --device cuda"
  timeout "${BENCH_TIMEOUT:-400}" $py bench/replay.py --device $gpu --json \
    --rows ${BENCH_ROWS:-mlp cnn gpt gpt-3.3m gpt-15m gpt2-small} >"$out/bench_$gpu.json" 2>"$out/bench.log"
  log "bench rc=$?"
fi

if has gpt2; then
  log "gpt2: GPT-2 small, block 1024, recorded on cuda"
  work=$(mktemp -d)
  d=$work/gpt2-1024
  /usr/bin/time -v timeout 200 $py -m replay record --preset gpt2-small --batch "${GPT2_BATCH:-4}" \
    --steps "${GPT2_STEPS:-2}" --checkpoint-interval 1 --device $gpu --out "$d" >>"$out/gpt2.log" 2>&1
  log "gpt2 record rc=$? $(grep -E 'Elapsed|Maximum resident' "$out/gpt2.log" | tr -s ' ' | tr '\n' ' ')"
  VERIFY_TIMEOUT=200 verify "$d" $gpu
  # the CPU verifier's budgets are the worker's (8 GiB, 1e12 FLOPs a step): this machine has more
  REPLAY_MEMORY_BUDGET_BYTES=$((96 << 30)) REPLAY_FLOP_BUDGET=1e14 VERIFY_TIMEOUT=${GPT2_CPU_TIMEOUT:-300} verify "$d" cpu
fi
if has profile; then
  log "profile: bench/replay.py --device $gpu --profile"
  timeout "${PROFILE_TIMEOUT:-200}" $py bench/replay.py --device $gpu --profile \
    --rows ${PROFILE_ROWS:-gpt-15m gpt2-small} >"$out/profile.txt" 2>&1
  log "profile rc=$?"
fi
log "done"
