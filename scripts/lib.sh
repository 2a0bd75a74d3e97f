# shellcheck shell=bash
# lib.sh - what the set-up scripts share (testcluster.sh with its Grid Engine cell, directory.sh):
# logging, a lock, waiting, writing files only when they change, detached daemons, and apt-get
# installs whose packages start no daemon of their own. Sourced, never run: the sourcing script
# sets LOG_TAG and LOCK_FILE first.

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    echo "lib.sh is sourced by the set-up scripts, not run" >&2
    exit 2
fi

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# Serialise concurrent invocations (e.g. parallel test runners).
take_lock() {
    exec 9>"$LOCK_FILE"
    flock -w 600 9 || die "could not take $LOCK_FILE"
}

# Start a daemon fully detached from the caller (own session, no inherited
# stdio, so a CI runner's pipes are not held open).
spawn_detached() {
    local out="$1"; shift
    setsid "$@" </dev/null >>"$out" 2>&1 9>&-
}

# wait_until TIMEOUT DESCRIPTION CMD...  (polls CMD every 0.1 s)
wait_until() {
    local timeout="$1" what="$2"; shift 2
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${timeout}s waiting for $what"
            return 1
        fi
        sleep 0.1
    done
}

# Write stdin to $1 (mode $2) only if the content differs. Returns 0 when the
# file changed, 1 when it was already up to date.
write_if_changed() {
    local dst="$1" mode="$2" tmp
    tmp="$(mktemp "${dst}.XXXXXX")"
    cat >"$tmp"
    if [[ -f $dst ]] && cmp -s "$tmp" "$dst"; then
        rm -f "$tmp"
        chmod "$mode" "$dst"
        return 1
    fi
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dst"
    return 0
}

POLICY_RC=/usr/sbin/policy-rc.d
policy_rc_mark() { echo "created by scripts/lib.sh for $LOG_TAG during apt-get install"; }

remove_policy_rc() {
    if [[ -f $POLICY_RC ]] && grep -qF "$(policy_rc_mark)" "$POLICY_RC"; then
        rm -f "$POLICY_RC"
    fi
}

# apt_install_unstarted PACKAGE...: install them with their postinsts' `invoke-rc.d ... start`
# refused (no init system here: the scripts start the daemons themselves), by a policy-rc.d of
# our own only if there is none already, removed after; once more after updating the package
# lists if the first try fails.
apt_install_unstarted() {
    if [[ ! -e $POLICY_RC && ! -L $POLICY_RC ]]; then
        printf '#!/bin/sh\n# %s\nexit 101\n' "$(policy_rc_mark)" >"$POLICY_RC"
        chmod 0755 "$POLICY_RC"
        trap remove_policy_rc EXIT
        trap 'exit 130' INT TERM HUP
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@"; then
        log "apt-get install failed - updating the package lists and retrying"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" \
            || die "apt-get install $* failed"
    fi
    remove_policy_rc
    trap - EXIT INT TERM HUP
}
