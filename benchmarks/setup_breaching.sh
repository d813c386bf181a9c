#!/usr/bin/env bash
# Create benchmarks/.breaching-env: a private venv with breaching 0.1.2 for
# benchmarks/vs_breaching.py. breaching is *not* a privaudit dependency and is never
# installed into the system site-packages.
#
# The venv sees the system site-packages (--system-site-packages), so it reuses the
# system torch / torchvision / scipy / numpy / Pillow / PyYAML; no second torch is
# downloaded. breaching is installed with --no-deps (its metadata asks for torch,
# torchvision, hydra-core, scipy, lpips). What `import breaching` and its attack code
# import beyond the system packages is only hydra-core + omegaconf (+ omegaconf's pinned
# antlr4-python3-runtime 4.9.*, which lands in the venv and shadows a system one there
# only). lpips is imported lazily by breaching.analysis (not used here); tokenizers,
# datasets and lmdb only by its text / LMDB dataset code (not used here).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
env_dir="$here/.breaching-env"
python="${PYTHON:-python3}"

if [ ! -x "$env_dir/bin/python" ]; then
    "$python" -m venv --system-site-packages "$env_dir"
fi
pip=("$env_dir/bin/python" -m pip --disable-pip-version-check --no-input)

"${pip[@]}" install --no-deps "breaching==0.1.2"
# Small pure-Python deps; torch etc. must come from the system site-packages.
"${pip[@]}" install "hydra-core>=1.1,<1.4" "omegaconf>=2.1,<2.4" "antlr4-python3-runtime==4.9.*"

# Sanity: breaching imports, and torch is the system one (not a venv copy).
"$env_dir/bin/python" - <<'PY'
import sys, torch, breaching, hydra, omegaconf
assert not torch.__file__.startswith(sys.prefix), f"torch was installed into the venv: {torch.__file__}"
print(f"breaching ready in {sys.prefix}: torch {torch.__version__} ({torch.__file__}), "
      f"hydra {hydra.__version__}, omegaconf {omegaconf.__version__}")
PY
