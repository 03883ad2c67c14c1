# Sourced by the project's scripts: finds a Python >= 3.12 and makes .venv with it.
# Plain `python3` is 3.11 on these machines and pyenv shims may answer "command not found",
# so every candidate is actually run before it is trusted.
find_python() {
    local cand
    for cand in "${PYTHON:-}" python3.13 python3.12 \
        /root/.pyenv/versions/3.13*/bin/python3.13 /root/.pyenv/versions/3.12*/bin/python3.12 \
        /usr/bin/python3.13 /usr/bin/python3.12 python3; do
        [ -n "$cand" ] || continue
        if "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
            command -v "$cand" 2>/dev/null || echo "$cand"
            return 0
        fi
    done
    echo "No Python 3.12 or newer found; set PYTHON=/path/to/python3.12" >&2
    return 1
}

ensure_venv() {
    local root="$1" stamp="$1/.venv/.installed"
    if [ ! -x "$root/.venv/bin/python" ]; then
        local py
        py=$(find_python) || exit 1
        "$py" -m venv "$root/.venv"
    fi
    # Reinstall only when pyproject.toml changed since the last install.
    if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
        "$root/.venv/bin/python" -m pip install --quiet --upgrade pip
        "$root/.venv/bin/python" -m pip install --quiet -e "$root[dev]"
        "$root/.venv/bin/python" -m pip check
        touch "$stamp"
    fi
}
