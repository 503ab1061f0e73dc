#!/usr/bin/env bash
# A Docker engine of its own for this machine (a VM with no systemd, no registry, cgroup v1
# hybrid, root without CAP_SYS_RESOURCE), and everything it changes undone afterwards.
#
#   scripts/containers.sh install      Debian's docker.io, docker-compose, mmdebstrap, runc, iptables
#   scripts/containers.sh start        install, then dockerd on its own socket (idempotent)
#   scripts/containers.sh status       running or not, and where (exit 0 running, 3 stopped)
#   scripts/containers.sh base         start, then make the local base image chattts-debian-base:bookworm
#                                      (mmdebstrap + docker import; skipped when present)
#   scripts/containers.sh image        base, then the CPU images chattts-serving:0.1.0-cpu and
#                                      chattts-serving-export:0.1.0-cpu (docker/Dockerfile, VARIANT=cpu);
#                                      times and size to results/deploy/image.json
#   scripts/containers.sh env          `export DOCKER_HOST=...`: eval "$(scripts/containers.sh env)"
#   scripts/containers.sh stop [--keep-images]
#                                      dockerd stopped, its bridges and iptables chains removed,
#                                      net.ipv4.ip_forward as it was, state removed (the image
#                                      cache kept with --keep-images)
#
# Sourced (`. scripts/containers.sh`), it defines the functions containers_install,
# containers_start, containers_status, containers_stop and the variables below, and runs nothing.
#
# Why started by hand: services do not start on install here (no systemd), and the daemon needs
#   - runc as its runtime (crun fails on this host's cgroup v1 hybrid),
#   - --default-ulimit nofile/nproc: runc cannot raise limits without CAP_SYS_RESOURCE, so a
#     container asking for more than the host's limits fails to start;
#   - its own data-root, exec-root and socket under one state directory, so that stopping it
#     removes exactly what it made and nothing of another engine's (podman) or of the host's.
# dockerd turns on net.ipv4.ip_forward and adds docker0, one br-<id> bridge per compose network
# and the DOCKER* iptables chains; `stop` removes them and restores ip_forward.

CONTAINERS_STATE=${CONTAINERS_STATE:-/var/lib/chattts-containers}
CONTAINERS_SOCKET="$CONTAINERS_STATE/docker.sock"
CONTAINERS_DOCKER_HOST="unix://$CONTAINERS_SOCKET"
# Debian's client (20.10, BuildKit built in) and daemon; another `docker` earlier on PATH may
# be a client that needs the buildx plugin for BuildKit.
CONTAINERS_DOCKER=${CONTAINERS_DOCKER:-/usr/bin/docker}
CONTAINERS_DOCKERD=${CONTAINERS_DOCKERD:-/usr/sbin/dockerd}
CONTAINERS_PACKAGES=(docker.io docker-compose mmdebstrap runc iptables)

_containers_log() { echo "containers: $*" >&2; }

containers_install() {
    local missing=() p
    for p in "${CONTAINERS_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
        _containers_log "needs root and apt-get to install: ${missing[*]}"
        return 1
    fi
    _containers_log "installing ${missing[*]}"
    # A freshly installed docker.io would be started by its maintainer script where services
    # run; here none do, and this script starts its own daemon.
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
        || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
}

_containers_running() {
    [ -S "$CONTAINERS_SOCKET" ] && DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" info >/dev/null 2>&1
}

containers_status() {
    if _containers_running; then
        echo "running: DOCKER_HOST=$CONTAINERS_DOCKER_HOST (pid $(cat "$CONTAINERS_STATE/dockerd.pid" 2>/dev/null), state $CONTAINERS_STATE)"
        return 0
    fi
    echo "stopped (state $CONTAINERS_STATE$([ -d "$CONTAINERS_STATE" ] || echo ', absent'))"
    return 3
}

containers_start() {
    containers_install || return 1
    _containers_running && return 0
    mkdir -p "$CONTAINERS_STATE"
    # What the daemon changes, as it was before the first start (kept across restarts).
    [ -f "$CONTAINERS_STATE/ip_forward.before" ] \
        || cat /proc/sys/net/ipv4/ip_forward >"$CONTAINERS_STATE/ip_forward.before"
    rm -f "$CONTAINERS_SOCKET"
    _containers_log "starting dockerd (log $CONTAINERS_STATE/dockerd.log)"
    setsid "$CONTAINERS_DOCKERD" \
        --host "$CONTAINERS_DOCKER_HOST" \
        --data-root "$CONTAINERS_STATE/data" \
        --exec-root "$CONTAINERS_STATE/exec" \
        --pidfile "$CONTAINERS_STATE/dockerd.pid" \
        --default-runtime runc \
        --default-ulimit nofile=20000:20000 \
        --default-ulimit nproc=32768:32768 \
        >>"$CONTAINERS_STATE/dockerd.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 120); do
        _containers_running && { _containers_log "dockerd ready after ${i}x0.5 s: DOCKER_HOST=$CONTAINERS_DOCKER_HOST"; return 0; }
        sleep 0.5
    done
    _containers_log "dockerd did not start; its log:"
    tail -20 "$CONTAINERS_STATE/dockerd.log" >&2
    return 1
}

# Delete every iptables rule that jumps to or names a DOCKER chain or one of ${bridges[@]},
# then the DOCKER chains themselves (filter and nat, IPv4).
_containers_iptables_clean() {
    local table line pattern="DOCKER"
    local b
    for b in "$@"; do pattern="$pattern|-[io] $b( |$)"; done
    for table in filter nat; do
        iptables -t "$table" -S 2>/dev/null | grep -E -- "^-A " | grep -E -- "$pattern" | while read -r line; do
            # shellcheck disable=SC2086  # the rule's own words
            iptables -t "$table" ${line/-A/-D} 2>/dev/null || true
        done || true
        iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}' | while read -r line; do
            iptables -t "$table" -F "$line" 2>/dev/null || true
        done || true
        iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^DOCKER/ {print $2}' | while read -r line; do
            iptables -t "$table" -X "$line" 2>/dev/null || true
        done || true
    done
}

containers_stop() {
    local keep_images=0 arg
    for arg in "$@"; do
        case "$arg" in
            --keep-images) keep_images=1 ;;
            *) _containers_log "stop: unknown option $arg"; return 2 ;;
        esac
    done
    # The bridges of this daemon's networks: docker0 and br-<first 12 of the network id>.
    local bridges=(docker0) id
    if _containers_running; then
        for id in $(DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" network ls -q --filter driver=bridge --no-trunc 2>/dev/null); do
            local name
            name=$(DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$id" 2>/dev/null)
            bridges+=("${name:-br-${id:0:12}}")
        done
        # Containers first (a graceful stop for each), then the daemon.
        local running
        running=$(DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" ps -q)
        # shellcheck disable=SC2086
        [ -n "$running" ] && DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" stop -t 10 $running >/dev/null 2>&1
    fi
    local pid
    pid=$(cat "$CONTAINERS_STATE/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        _containers_log "stopping dockerd ($pid)"
        kill -TERM "$pid"
        local i
        for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    # Its containerd (started by dockerd under the exec-root) ends with it; one left over after
    # a SIGKILL is found by its socket path.
    local cpid
    for cpid in $(pgrep -f -- "containerd --config $CONTAINERS_STATE/exec/" 2>/dev/null); do kill -TERM "$cpid" 2>/dev/null || true; done
    # Bridges left from an earlier run whose daemon died: every br-<id> still in its records.
    if [ -d "$CONTAINERS_STATE/data/network" ]; then
        for b in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^br-[0-9a-f]{12}$'); do
            grep -rqs "${b#br-}" "$CONTAINERS_STATE/data/network" && bridges+=("$b")
        done
    fi
    local b
    for b in "${bridges[@]}"; do
        ip link show "$b" >/dev/null 2>&1 && ip link delete "$b" 2>/dev/null && _containers_log "removed bridge $b"
    done
    _containers_iptables_clean "${bridges[@]}"
    if [ -f "$CONTAINERS_STATE/ip_forward.before" ]; then
        cat "$CONTAINERS_STATE/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
    fi
    # Mounts left under the state (overlay layers, netns files) would make rm fail.
    # (Every pipeline here may find nothing: `|| true`, since the script runs with pipefail.)
    grep -o " $CONTAINERS_STATE[^ ]*" /proc/mounts 2>/dev/null | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done || true
    if [ "$keep_images" -eq 1 ]; then
        find "$CONTAINERS_STATE" -mindepth 1 -maxdepth 1 ! -name data -exec rm -rf {} + 2>/dev/null
        _containers_log "stopped; image cache kept in $CONTAINERS_STATE/data"
    else
        rm -rf "$CONTAINERS_STATE"
        _containers_log "stopped; $CONTAINERS_STATE removed"
    fi
}

# The local base image every image here starts FROM (no registry to pull one from): Debian
# bookworm minbase from Debian's own packages, with Python 3.11 (and its shared library, which
# Triton's Python backend stub links) and the CA certificates. Made once; kept while it exists.
CONTAINERS_BASE_IMAGE=${CONTAINERS_BASE_IMAGE:-chattts-debian-base:bookworm}
CONTAINERS_BASE_PACKAGES=ca-certificates,python3,python3-venv,libpython3.11

containers_base() {
    containers_start || return 1
    if DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" image inspect "$CONTAINERS_BASE_IMAGE" >/dev/null 2>&1; then
        _containers_log "$CONTAINERS_BASE_IMAGE present"
        return 0
    fi
    local tmp t0
    tmp=$(mktemp -d)
    t0=$(date +%s.%N)
    _containers_log "making $CONTAINERS_BASE_IMAGE with mmdebstrap"
    if ! mmdebstrap --quiet --variant=minbase --include="$CONTAINERS_BASE_PACKAGES" \
            --aptopt='Apt::Install-Recommends "false"' \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
            bookworm "$tmp/rootfs.tar" http://deb.debian.org/debian >&2; then
        rm -rf "$tmp"
        return 1
    fi
    DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        --message "mmdebstrap --variant=minbase --include=$CONTAINERS_BASE_PACKAGES bookworm" \
        "$tmp/rootfs.tar" "$CONTAINERS_BASE_IMAGE" >/dev/null
    local rc=$?
    rm -rf "$tmp"
    [ $rc -eq 0 ] && _containers_log "$CONTAINERS_BASE_IMAGE made in $(( $(date +%s) - ${t0%.*} )) s"
    return $rc
}

# The CPU image (docker/Dockerfile, VARIANT=cpu) and its export image, built with no registry.
CONTAINERS_IMAGE=${CONTAINERS_IMAGE:-chattts-serving:0.1.0-cpu}
CONTAINERS_EXPORT_IMAGE=${CONTAINERS_EXPORT_IMAGE:-chattts-serving-export:0.1.0-cpu}
CONTAINERS_TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl

# docker/local/: the host's CA bundle and the torch CPU wheel (docker/local/README.md).
_containers_build_inputs() {
    local repo=$1 dir d
    cp /etc/ssl/certs/ca-certificates.crt "$repo/docker/local/ca-certificates.crt"
    [ -f "$repo/docker/local/$CONTAINERS_TORCH_WHEEL" ] && return 0
    # Where pip finds it on this host (its find-links), else from PyTorch's CPU index.
    for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true) /opt/wheels; do
        d=${dir#file://}
        if [ -f "$d/$CONTAINERS_TORCH_WHEEL" ]; then
            ln -f "$d/$CONTAINERS_TORCH_WHEEL" "$repo/docker/local/" 2>/dev/null \
                || cp "$d/$CONTAINERS_TORCH_WHEEL" "$repo/docker/local/"
            return 0
        fi
    done
    python3 -m pip download --no-deps --only-binary=:all: --dest "$repo/docker/local" \
        --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu" >&2
}

# Build both images; the build's seconds (and whether it started with no build cache) go to
# results/deploy/image.json, with the image's size.
containers_image() {
    local repo
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local base_t0 base_s=""
    base_t0=$(date +%s%N)
    if ! DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" image inspect "$CONTAINERS_BASE_IMAGE" >/dev/null 2>&1; then
        containers_base || return 1
        base_s=$(( ($(date +%s%N) - base_t0) / 1000000 ))
    fi
    containers_start || return 1
    _containers_build_inputs "$repo" || return 1
    local cold=0
    if ! DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" image inspect "$CONTAINERS_IMAGE" >/dev/null 2>&1 \
        && [ -z "$(DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" builder du 2>/dev/null | awk 'NR > 1 && $1 != "Reclaimable:" && $1 != "Total:"' | head -1)" ]; then
        cold=1
    fi
    local t0 build_ms
    t0=$(date +%s%N)
    _containers_log "building $CONTAINERS_IMAGE and $CONTAINERS_EXPORT_IMAGE ($([ $cold -eq 1 ] && echo cold || echo cached))"
    (cd "$repo" \
        && DOCKER_BUILDKIT=1 DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" build --progress=plain \
            -f docker/Dockerfile --build-arg VARIANT=cpu -t "$CONTAINERS_IMAGE" . >&2 \
        && DOCKER_BUILDKIT=1 DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" build --progress=plain \
            -f docker/Dockerfile --build-arg VARIANT=cpu --target export -t "$CONTAINERS_EXPORT_IMAGE" . >&2) || return 1
    build_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    local size
    size=$(DOCKER_HOST="$CONTAINERS_DOCKER_HOST" "$CONTAINERS_DOCKER" image inspect -f '{{.Size}}' "$CONTAINERS_IMAGE")
    _containers_log "built in $((build_ms / 1000)) s; $CONTAINERS_IMAGE is $size bytes"
    mkdir -p "$repo/results/deploy"
    python3 - "$repo/results/deploy/image.json" "$CONTAINERS_IMAGE" "$size" "$build_ms" "$cold" "$base_s" <<'PY'
import json, sys
from pathlib import Path
path, image, size, build_ms, cold, base_ms = sys.argv[1:]
out = Path(path)
data = json.loads(out.read_text()) if out.exists() else {}
data.update(image=image, image_size_bytes=int(size))
data["build_time_cold_s" if cold == "1" else "build_time_cached_s"] = int(build_ms) / 1000
if base_ms:
    data["base_build_time_s"] = int(base_ms) / 1000
out.write_text(json.dumps(data, indent=2) + "\n")
PY
}

containers_env() {
    echo "export DOCKER_HOST=$CONTAINERS_DOCKER_HOST"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    cmd=${1:-status}
    [ $# -gt 0 ] && shift
    case "$cmd" in
        install) containers_install ;;
        start) containers_start ;;
        stop) containers_stop "$@" ;;
        status) containers_status ;;
        env) containers_env ;;
        base) containers_base ;;
        image) containers_image ;;
        *) echo "usage: $0 install|start|base|image|stop [--keep-images]|status|env" >&2; exit 2 ;;
    esac
fi
