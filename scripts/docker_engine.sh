#!/usr/bin/env bash
# Make a Docker Engine available on this machine for `make matrix EXECUTOR=docker`: install
# Debian's docker.io (and debootstrap, which makes the offline base image) when they are missing,
# and start dockerd when no engine answers.  Idempotent: each run says what it found and what it
# did, and does nothing when the engine already answers.
#
# Usage: scripts/docker_engine.sh            (as root; `make docker-engine` runs it)
#
# Packages come from the machine's own apt sources.  The engine's storage driver is overlay2
# where the kernel has overlayfs, else vfs (slower, but works everywhere).  dockerd's log goes to
# $DOCKERD_LOG (default /var/log/blocksparse-dockerd.log); on failure its last lines are shown.
# Exit status: 0 the engine answers; 1 it could not be made to (the message says why).
set -euo pipefail

log=${DOCKERD_LOG:-/var/log/blocksparse-dockerd.log}
say() { echo "docker-engine: $*"; }
fail() { echo "docker-engine: error: $*" >&2; exit 1; }

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

running=0
if command -v docker >/dev/null && answers; then
    running=1
    say "engine already running ($(docker version --format 'server {{.Server.Version}}'))"
fi

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    [[ $(id -u) == 0 ]] || fail "${need[*]} missing and not root: run as root (sudo make docker-engine)"
    say "installing ${need[*]} from the machine's apt sources"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
        || fail "apt-get install ${need[*]} failed"
else
    say "docker.io and debootstrap already installed"
fi

((running)) && exit 0

[[ $(id -u) == 0 ]] || fail "no engine answers and starting dockerd needs root (sudo make docker-engine)"
if pgrep -x dockerd >/dev/null; then
    say "dockerd is running but does not answer yet; waiting for it"
else
    driver=vfs
    grep -qw overlay /proc/filesystems 2>/dev/null || modprobe overlay 2>/dev/null || true
    grep -qw overlay /proc/filesystems 2>/dev/null && driver=overlay2
    say "starting dockerd (storage driver $driver, log $log)"
    mkdir -p "$(dirname "$log")"
    # setsid: the engine outlives this script and the make that ran it.
    setsid dockerd --storage-driver="$driver" >>"$log" 2>&1 </dev/null &
fi
for _ in $(seq 60); do
    if answers; then
        say "engine up ($(docker version --format 'server {{.Server.Version}}'), $(docker info --format 'storage {{.Driver}}, cgroup v{{.CgroupVersion}}'))"
        exit 0
    fi
    if ! pgrep -x dockerd >/dev/null; then
        break
    fi
    sleep 1
done
echo "docker-engine: error: dockerd did not come up; the end of $log:" >&2
tail -n 15 "$log" >&2 || true
exit 1
