#!/usr/bin/env bash
# The device checks a session runs when it is lent a GPU machine, as prepared scripts (the device
# tool's `run`, carry [".whl", "shared"]; results come back under $OUT, at most 8 files).
#
# Here first (at no device time): `bash tools/gpu_session.sh --wheels` downloads what the device's
# image lacks (lark, gguf and the linters the suite imports) into .whl/ for its Python 3.12, and
# copies ../shared into ./shared (the tests read the SPEC's models there; ../shared does not travel),
# both named in .git/info/exclude.
#
# There, each check under its own time limit (a slow one cannot starve the rest), every log in
# $OUT, in calls made back to back while the machine is warm, so that a later one can be shaped by
# what an earlier one found:
#   `bash tools/gpu_session.sh bench` (about 270 s on an H200):
#   1. benchmarks.llama --device gpu --quick --dtype bf16: issue 40's GPU rows, with the time to
#      first token split into JAX's compile stages
#   2. benchmarks.quantized_gpu --static-loop on the TinyLlama-shaped Q4_K model: the fused loop's
#      8 steps per check (runtime/kernels.py STEPS_PER_CHECK) against its fori_loop row (issue 42)
#   `bash tools/gpu_session.sh probe` (about 250 s): tools/gpu_probe.py's open questions (the
#      integer matmul that doubled; what Session.step's host path costs; where the decode step's
#      XLA:GPU compile time goes)
#   `bash tools/gpu_session.sh suite SECONDS`: the suite in 16 processes for SECONDS (default 300),
#      tests/test_interrupt.py first, then the slowest files; at the limit pytest gets SIGINT, so
#      its summary of what ran still prints (`-v`: each result too). JAX's allocator grows instead
#      of taking 75% of the GPU per process (16 processes that preallocate abort).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl lark==1.3.1 gguf==0.19.0 pyflakes vulture
  rm -rf shared && cp -r ../shared shared
  for p in /.whl/ /shared/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >> .git/info/exclude; done
  ls -l .whl; du -sh shared
  exit
fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OI2JAX_CACHE_DIR=none OI2JAX_SHARED=$PWD/shared/openinfer
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
python3 -c "import jax; print(jax.__version__, jax.devices())" >> "$OUT/device.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...: one check under its limit, its log in $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}
export PYTHONUNBUFFERED=1
case "${1:-bench}" in
  bench)
    step llama_gpu 170 python3 -m benchmarks.llama --device gpu --quick --dtype bf16 --out "$OUT/results"
    step quantized_gpu 170 python3 -m benchmarks.quantized_gpu --skip-products --no-bf16 --kinds Q4_K --static-loop \
      --work /tmp/qgpu --out "$OUT/results" ;;
  probe)
    step probe_int_matmul 90 python3 tools/gpu_probe.py int-matmul
    step probe_step 60 python3 tools/gpu_probe.py step
    step probe_ttft 180 python3 tools/gpu_probe.py ttft --work /tmp/probe ;;
  suite)
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    first="tests/test_interrupt.py tests/test_docs_snippets.py tests/test_ops.py tests/test_prefill.py"
    first="$first tests/test_differential.py tests/test_benchmarks_smoke.py tests/test_generate.py"
    rest=$(ls tests/test_*.py | grep -v -F -x -f <(tr ' ' '\n' <<< "$first"))
    t0=$SECONDS
    timeout -s INT -k 20 "${2:-300}" python3 -m pytest -v -rfE -n 16 --dist loadfile -p no:cacheprovider \
      $first $rest > "$OUT/suite.log" 2>&1
    echo "suite: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    grep -c " PASSED " "$OUT/suite.log" | sed 's/^/passed lines: /' | tee -a "$OUT/summary.txt" ;;
esac
cat "$OUT/summary.txt"
