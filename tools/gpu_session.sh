#!/usr/bin/env bash
# The device checks a session runs when it is lent a GPU machine, as one prepared script (the
# device tool's `run`, carry [".whl"], timeout about 590 s; results come back under $OUT).
#
# Here first (at no device time): `bash tools/gpu_session.sh --wheels` downloads what the device's
# image lacks (lark, gguf and the linters the suite imports) into .whl/ for its Python 3.12; put
# `/.whl/` in .git/info/exclude or rely on .gitignore.  There: `bash tools/gpu_session.sh`.
#
# What it runs, in order of what the open issues still need (each under its own time limit, so a
# slow one cannot starve the rest; every log lands in $OUT):
#   1. benchmarks.quantized_gpu --static-loop on the TinyLlama-shaped Q4_K model: the fused loop's
#      8 steps per check (runtime/kernels.py STEPS_PER_CHECK) against its fori_loop row (issue 42)
#   2. benchmarks.llama --device gpu --quick --dtype bf16: issue 40's GPU rows
#   3. the suite, tests/test_interrupt.py first (never reached on a GPU so far), then the rest
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl lark==1.3.1 gguf==0.19.0 pyflakes vulture
  ls -l .whl
  exit
fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OI2JAX_CACHE_DIR=none
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.txt" 2>&1
python3 -c "import jax; print(jax.__version__, jax.devices())" >> "$OUT/device.txt" 2>&1
step() {  # step NAME SECONDS COMMAND...: one check under its limit, its log in $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
}
step quantized_gpu 200 python3 -m benchmarks.quantized_gpu --skip-products --no-bf16 --kinds Q4_K --static-loop \
  --work /tmp/qgpu --out "$OUT/results"
step llama_gpu 150 python3 -m benchmarks.llama --device gpu --quick --dtype bf16 --out "$OUT/results"
step interrupt 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_interrupt.py
step suite 170 python3 -m pytest -q -n 4 --dist loadfile -p no:cacheprovider tests --deselect tests/test_interrupt.py
tail -3 "$OUT"/*.log > "$OUT/tails.txt" 2>&1
cat "$OUT/summary.txt"
