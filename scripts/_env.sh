# Sourced by scripts/test, scripts/demo and the benchmarks: make .venv with
# torch 2.13.0 first (never let a dependency range pull a CUDA build), then the
# project and its dev tools.  Idempotent and quiet when already done.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FRENZY_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
    echo "==> creating $VENV" >&2
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    "$PY" -m pip install --upgrade pip >&2
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    echo "==> installing torch 2.13.0 (CPU build where no CUDA build is installed)" >&2
    "$PY" -m pip install --progress-bar on "torch==2.13.0" >&2
fi
stamp="$VENV/.frenzy-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
    echo "==> installing frenzy-pool and its dependencies" >&2
    "$PY" -m pip install --progress-bar on -e "$ROOT[dev]" >&2
    touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
