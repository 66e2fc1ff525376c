# Shared by scripts/serve and scripts/test: make .venv and everything MLX needs to be fast.
# Usage: . scripts/setup-env.sh EXTRAS   (pip extras, e.g. "[test]", or "" for none: an argument
# must be given, or the caller's own arguments would be taken for it)

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "agent-memory needs Python 3.11 or newer ($PYTHON is $("$PYTHON" -V 2>&1))" >&2
    exit 1
fi

# MLX's Linux CPU wheel links a slow reference BLAS; the package loads Debian's OpenBLAS
# instead when it is installed (37x faster float32 matmul, see docs/architecture.md).
if [ "$(uname -s)" = Linux ] && ! ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so\.0'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing OpenBLAS (libopenblas0-pthread) ..."
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null && command -v apt-get >/dev/null; then
        echo "installing OpenBLAS (libopenblas0-pthread) with sudo ..."
        sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread >/dev/null
    else
        echo "WARNING: OpenBLAS is not installed and this user cannot install it; MLX will run" >&2
        echo "         several times slower on CPU. Fix: sudo apt-get install libopenblas0-pthread" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Install only when pyproject.toml or the extras changed since the last install: a normal start
# then runs no installer (and shows none of its noise). The package itself is editable.
stamp=".venv/.installed$(printf '%s' "${1:-}" | tr -cd 'a-z,-')"
if ! cmp -s pyproject.toml "$stamp"; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${1:-}"
    cp pyproject.toml "$stamp"
fi
