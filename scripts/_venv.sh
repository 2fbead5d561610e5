# shellcheck shell=bash
# Sourced by scripts/test, scripts/demo and .ci/run (not executable on its own).
#
# `warpdeck_venv dev` makes sure .venv exists and holds an editable install of the project with its
# `dev` extra (the test and check tools, and torch, Ray, pyarrow, Pillow for the tests that use
# them); `warpdeck_venv base` asks for the project alone (`pip install -e .`), all the demo needs:
# on a fresh clone about 150 MB in half a minute, against 1.6 GB and two minutes with the dev extra.
#
# Both share one venv. A stamp file per level is written after each successful install:
#   .warpdeck-dev-installed   after `pip install -e '.[dev]'`
#   .warpdeck-base-installed  after `pip install -e .`
# The dev install includes the base, so `base` is satisfied by either stamp (the demo after the tests
# installs nothing) and `dev` only by its own (the tests after the demo install the dev extra). A
# stamp older than pyproject.toml does not count, so an edit to the dependencies reinstalls what the
# calling script needs, and nothing else: a second call costs nothing. WARPDECK_VENV overrides the
# venv's place. pip's output is kept quiet; on failure it is printed in full.

WARPDECK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WARPDECK_VENV="${WARPDECK_VENV:-$WARPDECK_ROOT/.venv}"

_warpdeck_stamp_fresh() {  # _warpdeck_stamp_fresh FILE: FILE exists and is not older than pyproject.toml
    [[ -f "$1" && ! "$WARPDECK_ROOT/pyproject.toml" -nt "$1" ]]
}

warpdeck_venv() {  # warpdeck_venv dev|base
    local level="${1:?warpdeck_venv: say dev or base}"
    local venv="$WARPDECK_VENV"
    local dev_stamp="$venv/.warpdeck-dev-installed" base_stamp="$venv/.warpdeck-base-installed"
    local extra stamp log

    case "$level" in
        dev)  extra="[dev]"; stamp="$dev_stamp" ;;
        base) extra=""; stamp="$base_stamp" ;;
        *)    echo "warpdeck_venv: unknown level '$level' (dev or base)" >&2; return 2 ;;
    esac

    if [[ ! -x "$venv/bin/python" ]]; then
        echo "scripts: creating $venv" >&2
        python3 -m venv "$venv"
        rm -f "$dev_stamp" "$base_stamp"
    fi
    if _warpdeck_stamp_fresh "$dev_stamp" || { [[ $level == base ]] && _warpdeck_stamp_fresh "$base_stamp"; }; then
        return 0
    fi

    echo "scripts: installing warpdeck$extra (editable) into $venv" >&2
    log="$(mktemp)"
    if ! "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
            -e "$WARPDECK_ROOT$extra" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "scripts: pip install -e '.$extra' failed (output above)" >&2
        return 1
    fi
    rm -f "$log"
    touch "$stamp"
}
