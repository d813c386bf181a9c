#!/usr/bin/env bash
# Everything GPU-related in one table, in at most 8 minutes, on a fresh GPU machine without
# network access (torch, scipy, scikit-image, matplotlib, rich and safetensors there; the
# project's wheel and the pure-Python opacus and lpips carried in .whl/, made here with
#   pip wheel --no-deps -w .whl . && pip download --no-deps -d .whl opacus lpips
# ). Nothing is fetched. Usage: bash benchmarks/gpu.sh [OUT]   (default $OUT, else gpu-out)
#
# Rows: the card; the README's main command end to end on cuda and on the machine's CPU
# (same machine, same run: the ratio is the GPU's gain); benchmarks/run.py --quick on cuda
# (batched IG against one call per observation); benchmarks/scale.py on cuda (ResNet-18 DPDL,
# peak GPU memory and seconds per round against agents). Each section's raw output is kept
# beside the table; a section that fails is a row saying so, and the others still run.
set -uo pipefail
OUT=${1:-${OUT:-gpu-out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$REPO"/.whl/*.whl || exit 1
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" MPLBACKEND=Agg
WORK=$(mktemp -d)
cd "$WORK" || exit 1
TABLE="$OUT/gpu.md"
card=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
{
  echo "# privaudit on $card"
  echo
  echo "| what | result |"
  echo "|---|---|"
} >"$TABLE"
row() { echo "| $1 | $2 |" >>"$TABLE"; }

timed() {  # timed NAME LIMIT_S CMD...: wall seconds of CMD (killed after LIMIT_S), or FAIL
  local name=$1 limit=$2
  shift 2
  local t0 t1
  t0=$(date +%s.%N)
  if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.1f} s')"
  else
    echo "FAIL (exit $?, see $name.log)"
  fi
}

row "card" "$card"
row "main command, cuda (privaudit attack --target dpdl-cg --round 200 --device cuda)" \
  "$(timed main-cuda 100 privaudit attack --target dpdl-cg --round 200 --device cuda --no-progress --out main-cuda)"
row "main command, CPU of the same machine ($(nproc) cores)" \
  "$(timed main-cpu 75 privaudit attack --target dpdl-cg --round 200 --no-progress --out main-cpu)"
row "first line, cuda" "$(head -1 "$OUT/main-cuda.log")"
row "result, cuda" "$(grep -m1 'PSNR' "$OUT/main-cuda.log" | cut -c1-160)"
if timeout 40 python3 "$REPO/benchmarks/run.py" --device cuda --quick --only throughput \
  --json "$OUT/run.json" >"$OUT/run.log" 2>&1; then
  row "benchmarks/run.py --device cuda --quick" "$(grep -E 'ratio|×|PASS|FAIL' "$OUT/run.log" | head -6 | tr '\n' ';' | cut -c1-400)"
else
  row "benchmarks/run.py --device cuda --quick" "FAIL (see run.log)"
fi
if [ -f "$REPO/benchmarks/scale.py" ]; then
  if timeout 80 python3 "$REPO/benchmarks/scale.py" --device cuda --agents 4 16 --rounds 1 \
    --batch-size 32 --dirichlet-alpha 1000 --timeout 40 >"$OUT/scale.log" 2>&1; then
    row "benchmarks/scale.py --device cuda (ResNet-18 DPDL, B = 32, 4 and 16 agents)" "table below"
    sed -n '1,40p' "$OUT/scale.log" >>"$OUT/gpu.md.scale"
  else
    row "benchmarks/scale.py --device cuda" "FAIL (see scale.log)"
  fi
fi
cat "$TABLE"
[ -f "$OUT/gpu.md.scale" ] && { echo; echo '```'; cat "$OUT/gpu.md.scale"; echo '```'; } | tee -a "$TABLE"
exit 0
