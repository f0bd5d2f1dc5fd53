#!/bin/sh
# Builds benchmarks/ggml_ffi/libggml_matvec.so against a built ggml checkout (research only):
#   GGML=/path/to/ggml sh benchmarks/ggml_ffi/build.sh   (ggml built with cmake -B build, ggml-cpu target)
set -e
HERE=$(dirname "$0")
PY=${PYTHON:-python}
JAXINC=$($PY -c "import jax; print(jax.ffi.include_dir())")
g++ -O3 -march=native -std=c++17 -shared -fPIC -I"$JAXINC" -I"$GGML/include" "$HERE/ggml_matvec.cc" \
  -L"$GGML/build/src" -lggml-cpu -lggml-base -Wl,-rpath,"$GGML/build/src" -o "$HERE/libggml_matvec.so"
