#!/usr/bin/env bash
# The numerically sensitive tests again, as three other machines would run them:
#   avx2       - a plain AVX2 CPU: PyTorch, oneDNN and MKL capped at AVX2, the C++ kernels built
#                for x86-64-v3 (AVX2 + FMA) instead of this CPU;
#   eager      - the eager PyTorch step only (ABPS_KERNELS=torch);
#   no-compiler- no C++ compiler on PATH (the kernels cannot build: the product must fall back).
# Each pass uses a fresh kernel cache, so no library built for this CPU is reused.
# Usage: scripts/test_cpus.sh [PYTHON]   (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
TESTS=(tests/test_federation_engine.py tests/test_federation_kernels.py tests/test_loop_driver.py
       tests/test_sage_engine.py tests/test_gossip_sim.py tests/test_gossip_variance.py tests/test_gossip_model.py
       tests/test_federation_mixing.py tests/test_federation_metrics.py tests/test_baselines_bnn.py
       tests/test_baselines_moon.py tests/test_baselines_decentralized.py tests/test_clinical_run.py
       tests/test_abps_method.py)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_pass() {  # name, then env assignments
  local name=$1; shift
  echo "== test pass: $name"
  env "$@" ABPS_KERNELS_CACHE="$work/kernels-$name" "$PY" -m pytest -q -n 2 --dist loadfile -p no:cacheprovider "${TESTS[@]}"
}

if [ "$(uname -m)" = x86_64 ]; then
  run_pass avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
    ABPS_KERNELS_MARCH=x86-64-v3
else
  echo "== test pass: avx2 skipped (not an x86-64 machine)"
fi
run_pass eager ABPS_KERNELS=torch

# A PATH with every command of the current PATH except the C and C++ compilers.
bin="$work/bin"; mkdir -p "$bin"
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    n=$(basename "$f")
    case "$n" in g++*|c++*|clang*|gcc*|cc|cc-*|*-g++*|*-gcc*|*-c++*|x86_64-linux-gnu-*|cpp*) continue ;; esac
    [ -e "$bin/$n" ] || ln -s "$f" "$bin/$n" 2>/dev/null || true
  done
done
if PATH="$bin" command -v g++ c++ clang++ >/dev/null 2>&1; then
  echo "error: could not hide the C++ compiler from PATH" >&2; exit 1
fi
PATH="$bin" CXX= ABPS_KERNELS_CACHE="$work/kernels-check" "$PY" -W ignore -c \
  "from federation.engine import kernels; assert kernels.step_name() == 'eager', 'kernels built without a compiler'"
run_pass no-compiler PATH="$bin" ABPS_KERNELS=auto CXX=
