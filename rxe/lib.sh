# Shared by rxe/guest, rxe/build-libdisni and rxe/stage (sourced, not run).

# The cache for the guest kernel, its initramfs and libdisni. /var/tmp survives reboots on CI machines that keep their
# disk, and a fresh machine fills it in a minute or two.
RXE_CACHE=${RXE_CACHE:-/var/tmp/rdma-bridge-rxe}

rxe_log() {
    echo "${RXE_TOOL:-rxe}: $*" >&2
}

rxe_die() {
    local status=$1
    shift
    rxe_log "$*"
    exit "$status"
}

rxe_require_root() {
    [ "$(id -u)" = 0 ] \
        || rxe_die 2 "must run as root: it installs packages with apt-get and starts QEMU (run it with sudo)"
}

# rxe_install PACKAGE...: installs the Debian packages that are missing. A fresh machine (or container) often has no
# package lists yet, so a failed install is retried once after apt-get update.
rxe_install() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    command -v apt-get >/dev/null || rxe_die 3 "missing packages ${missing[*]} and no apt-get: install them by hand"
    mkdir -p "$RXE_CACHE"
    local apt_log=$RXE_CACHE/apt.log
    rxe_log "installing ${missing[*]} (log: $apt_log)"
    if ! DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y --no-install-recommends "${missing[@]}" \
            >>"$apt_log" 2>&1; then
        rxe_log "apt-get install failed; running apt-get update and trying again"
        timeout 600 apt-get update >>"$apt_log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y --no-install-recommends "${missing[@]}" \
            >>"$apt_log" 2>&1 \
            || { tail -20 "$apt_log" >&2; rxe_die 3 "apt-get install ${missing[*]} failed (full log: $apt_log)"; }
    fi
}

# Prints seconds since the epoch with tenths, for durations.
rxe_now() {
    date +%s.%N | cut -c1-12
}

# rxe_elapsed START: seconds since START (from rxe_now), one decimal.
rxe_elapsed() {
    awk -v a="$1" -v b="$(rxe_now)" 'BEGIN { printf "%.1f", b - a }'
}

# rxe_load_steps FILE: reads the stage's step list (see rxe/steps) into STEPS (names, in order), STEP_LIMIT,
# STEP_HOST_GOALS, STEP_GUEST_GOALS and STEP_ARGS (the Maven arguments, shell-quoted), keyed by name.
rxe_load_steps() {
    STEPS=()
    declare -gA STEP_LIMIT=() STEP_HOST_GOALS=() STEP_GUEST_GOALS=() STEP_ARGS=()
    step() {
        local name=$1 limit=$2 host=test guest=org.apache.maven.plugins:maven-surefire-plugin:test
        shift 2
        while [ $# -gt 0 ] && [ "$1" != -- ]; do
            case "$1" in
                --host) host=$2; shift 2 ;;
                --guest) guest=$2; shift 2 ;;
                *) rxe_die 2 "step $name: unknown option $1 (expected: --host GOALS, --guest GOALS, -- MAVEN_ARGS)" ;;
            esac
        done
        [ "${1:-}" = -- ] || rxe_die 2 "step $name: expected -- before the Maven arguments"
        shift
        case "$limit" in ''|*[!0-9]*) rxe_die 2 "step $name: time limit '$limit' is not a number of seconds" ;; esac
        [ -z "${STEP_LIMIT[$name]:-}" ] || rxe_die 2 "step $name is defined twice"
        STEPS+=("$name")
        STEP_LIMIT[$name]=$limit
        STEP_HOST_GOALS[$name]=$host
        STEP_GUEST_GOALS[$name]=$guest
        STEP_ARGS[$name]=$(printf '%q ' "$@")
    }
    . "$1"
    unset -f step
}
