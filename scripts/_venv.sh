# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo (not executable on its own).
#
# Makes sure .venv exists and holds an editable install of the project with its `dev` extra.
# The install is redone only when pyproject.toml is newer than the stamp written after the last
# successful install, so a second call costs nothing. WARPDECK_VENV overrides the venv's place.
# pip's output is kept quiet; on failure it is printed in full.

WARPDECK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WARPDECK_VENV="${WARPDECK_VENV:-$WARPDECK_ROOT/.venv}"

warpdeck_venv() {
    local venv="$WARPDECK_VENV"
    local stamp="$venv/.warpdeck-dev-installed"
    local log

    if [[ ! -x "$venv/bin/python" ]]; then
        echo "scripts: creating $venv" >&2
        python3 -m venv "$venv"
        rm -f "$stamp"
    fi
    if [[ -f "$stamp" && ! "$WARPDECK_ROOT/pyproject.toml" -nt "$stamp" ]]; then
        return 0
    fi

    echo "scripts: installing warpdeck[dev] (editable) into $venv" >&2
    log="$(mktemp)"
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
            -e "${WARPDECK_ROOT}[dev]" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "scripts: pip install -e '.[dev]' failed (output above)" >&2
        return 1
    fi
    rm -f "$log"
    touch "$stamp"
}
