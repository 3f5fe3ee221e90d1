#!/usr/bin/env bash
# Build benchmarks/.venv-compare: its own virtual environment with PyTorch Lightning and
# Hugging Face Accelerate from the package registry, amptrain installed editable, and torch
# pinned to the version amptrain is developed against (2.13.0; never let pip upgrade it to
# a different build, e.g. one that pulls gigabytes of CUDA wheels).
#
#   bash benchmarks/setup_compare_env.sh            # then:
#   benchmarks/.venv-compare/bin/python benchmarks/vs_lightning_accelerate.py
#
# TORCH_SPEC overrides the torch requirement (e.g. on a GPU machine: TORCH_SPEC=torch).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="$here/.venv-compare"
torch_spec="${TORCH_SPEC:-torch==2.13.0}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# One resolver run with torch pinned, so that neither lightning, accelerate nor amptrain
# (editable, from this checkout) can move it.
"$venv/bin/python" -m pip install --quiet "$torch_spec" lightning accelerate -e "$root"
"$venv/bin/python" - "$torch_spec" <<'PY'
import sys

import accelerate
import lightning
import torch

spec = sys.argv[1]
wanted = spec.split("==", 1)[1] if "==" in spec else None
print(f"torch {torch.__version__}, lightning {lightning.__version__}, "
      f"accelerate {accelerate.__version__}")
if wanted and torch.__version__.split("+")[0] != wanted:
    sys.exit(f"torch is {torch.__version__}, expected {wanted}: the install replaced it")
PY
echo "ready: $venv/bin/python benchmarks/vs_lightning_accelerate.py"
