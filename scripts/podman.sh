#!/usr/bin/env bash
# Rootful podman for `podman kube play` of the Kubernetes manifests (tests/deploy/test_k8s.py),
# set up for hosts like CI's: a VM with cgroup v1 in hybrid mode, root without
# CAP_SYS_RESOURCE, no image registry.
#   - crun (podman's preferred runtime) fails there ("cgroups in hybrid mode not supported"):
#     the runtime is runc;
#   - runc cannot raise a container's rlimits above the caller's, and Triton needs more open
#     files and processes than the defaults: containers.conf sets `default_ulimits`;
#   - everything podman keeps (images, containers, CNI network configs, volumes, locks) lives
#     in one state directory, so that `stop` can remove it.
#
#   scripts/podman.sh start          install podman + runc when missing (Debian's packages),
#                                    write the configuration, check that podman runs
#   scripts/podman.sh podman ARGS    podman with this configuration (what the tests call)
#   scripts/podman.sh load IMAGE     copy IMAGE from dockerd into podman's store, when missing
#   scripts/podman.sh env            the environment lines that point podman at it
#   scripts/podman.sh stop           remove every pod, container, image and the state
#                                    directory; undo the host changes: the cni-podman0 bridge,
#                                    CNI's iptables chains, CNI's IP leases, ip_forward
#
# The state directory is $CHATTTS_PODMAN_DIR (default /var/tmp/chattts-podman), the size of
# every /dev/shm $CHATTTS_PODMAN_SHM_SIZE (default 2g, read at `start`). Needs root.
set -euo pipefail

DIR=${CHATTTS_PODMAN_DIR:-/var/tmp/chattts-podman}
BRIDGE=cni-podman0             # the bridge of podman's default CNI network ("podman")
CNI_LEASES_DIR=/var/lib/cni/networks  # host-local IPAM's leases, one directory per network
SHM_SIZE=${CHATTTS_PODMAN_SHM_SIZE:-2g}  # /dev/shm of each pod (docker/k8s/deployment.yaml's dshm sizeLimit)
PACKAGES=(podman runc containernetworking-plugins iptables catatonit)

export CONTAINERS_CONF="$DIR/containers.conf"
export CONTAINERS_STORAGE_CONF="$DIR/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$DIR/registries.conf"

die() { echo "podman.sh: $*" >&2; exit 1; }

install_missing() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install ${missing[*]} (Debian 12's podman 4.3) by hand"
  echo "podman.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  local apt=(apt-get -q -o DPkg::Lock::Timeout=600)  # another install may hold the lock: wait
  "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { "${apt[@]}" update >/dev/null && "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null; } \
    || die "could not install ${missing[*]}"
}

write_config() {
  mkdir -p "$DIR"/{storage,run,tmp,cni}
  # ip_forward as it was before podman's first container turned it on; `stop` restores it.
  [ -f "$DIR/ip_forward.before" ] || cat /proc/sys/net/ipv4/ip_forward >"$DIR/ip_forward.before"
  cat >"$CONTAINERS_CONF" <<EOF
[containers]
# runc cannot raise rlimits (no CAP_SYS_RESOURCE): give every container these at creation.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
# Every container's and pod's /dev/shm: a tmpfs of this size. podman 4.3's kube play turns the
# Deployment's memory emptyDir into a disk volume shared by all pods, so that volume is
# dropped from the played manifest and the size is given here (the tests pass its sizeLimit).
shm_size = "$SHM_SIZE"

# Only settings that podman also hands to the cleanup process conmon runs when a container
# exits (--runtime, --cgroup-manager, --events-backend, --tmpdir, --root, --runroot, ...): one
# it does not (static_dir, volume_path, events_logfile_path) makes that process look in
# another database, and every exit then waits 20 s for a cleanup that never comes. The
# database and volumes live under graphroot, the events log under tmp_dir.
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$DIR/tmp"

[network]
network_backend = "cni"
network_config_dir = "$DIR/cni"
EOF
  cat >"$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "overlay"
graphroot = "$DIR/storage"
runroot = "$DIR/run"
EOF
  # No registry is reachable: never try one (an image is loaded from dockerd or not at all).
  printf 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n' >"$CONTAINERS_REGISTRIES_CONF"
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (rootful podman)"
  install_missing
  write_config
  podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupsVersion}} {{.Store.GraphRoot}}' >/dev/null \
    || die "podman does not run with $CONTAINERS_CONF"
  echo "podman.sh: podman $(podman version --format '{{.Client.Version}}') with runc, state in $DIR"
}

cmd_load() {
  local image=${1:?usage: podman.sh load IMAGE}
  [ -f "$CONTAINERS_CONF" ] || die "run scripts/podman.sh start first"
  if podman image exists "$image"; then return 0; fi
  # dockerd of scripts/containers.sh listens on a socket of its own
  if [ -z "${DOCKER_HOST:-}" ] && [ -x "$(dirname "$0")/containers.sh" ]; then
    eval "$("$(dirname "$0")/containers.sh" env)"
  fi
  command -v docker >/dev/null 2>&1 && docker image inspect "$image" >/dev/null 2>&1 \
    || die "$image is in neither podman's store nor dockerd's (build it with \`make image\`)"
  docker save "$image" | podman load --quiet >/dev/null
  podman image exists "$image" || die "podman load did not give $image"
}

remove_cni_iptables() {  # CNI's chains (CNI-*) and the rules that jump to them, in nat and filter
  command -v iptables >/dev/null 2>&1 || return 0
  local table rule chain
  for table in nat filter; do
    iptables -t "$table" -S 2>/dev/null | grep -E '^-A ' | grep -vE '^-A CNI-' | grep -E -- '-j CNI-' \
      | sed 's/^-A /-D /' | while read -r rule; do eval "iptables -t $table $rule" || true; done || true
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^CNI-/ {print $2}'); do
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^CNI-/ {print $2}'); do
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

cmd_stop() {
  # The default network (podman, on cni-podman0) and those podman made in our config dir
  # (kube play makes "podman-default-kube-network" on a bridge of its own): bridges and leases.
  local networks=(podman) bridges=("$BRIDGE") conf net
  for conf in "$DIR"/cni/*.conflist; do
    [ -f "$conf" ] || continue
    networks+=("$(sed -n 's/^ *"name": *"\([^"]*\)".*/\1/p' "$conf" | head -n1)")
    bridges+=("$(sed -n 's/^ *"bridge": *"\([^"]*\)".*/\1/p' "$conf" | head -n1)")
  done
  if command -v podman >/dev/null 2>&1 && [ -f "$CONTAINERS_CONF" ]; then
    podman pod rm --all --force --time 0 >/dev/null 2>&1 || true
    podman rm --all --force --time 0 >/dev/null 2>&1 || true
    podman volume rm --all --force >/dev/null 2>&1 || true
    podman system reset --force >/dev/null 2>&1 || true
  fi
  for net in "${bridges[@]}"; do
    if [ -n "$net" ] && ip link show "$net" >/dev/null 2>&1; then ip link delete "$net"; fi
  done
  remove_cni_iptables
  for net in "${networks[@]}"; do
    if [ -n "$net" ]; then rm -rf "${CNI_LEASES_DIR:?}/$net" /var/lib/cni/results/"$net"-*; fi
  done
  rmdir "$CNI_LEASES_DIR" /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  # ip_forward back to what it was, unless another engine's bridge (dockerd's) still needs it.
  if [ -f "$DIR/ip_forward.before" ]; then
    local before
    before=$(cat "$DIR/ip_forward.before")
    if [ "$before" = 0 ] && ip link show docker0 >/dev/null 2>&1; then
      echo "podman.sh: leaving net.ipv4.ip_forward=1: docker0 exists (dockerd uses it)"
    else
      echo "$before" >/proc/sys/net/ipv4/ip_forward
    fi
  fi
  if [ -d "$DIR" ]; then
    # overlay mounts of containers that did not stop cleanly would keep rm from finishing
    grep -F " $DIR/" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$DIR"
  fi
  echo "podman.sh: stopped; bridges ${bridges[*]}, CNI's iptables chains and leases, $DIR removed"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  load) shift; cmd_load "$@" ;;
  podman) shift; [ -f "$CONTAINERS_CONF" ] || die "run scripts/podman.sh start first"; exec podman "$@" ;;
  env) printf 'export CONTAINERS_CONF=%q CONTAINERS_STORAGE_CONF=%q CONTAINERS_REGISTRIES_CONF=%q\n' \
         "$CONTAINERS_CONF" "$CONTAINERS_STORAGE_CONF" "$CONTAINERS_REGISTRIES_CONF" ;;
  *) echo "usage: $0 start|stop|load IMAGE|podman ARGS...|env" >&2; exit 2 ;;
esac
