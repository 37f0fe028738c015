#!/usr/bin/env bash
# Build the sandbox base image farm-base:bookworm without a registry: debootstrap a minimal
# Debian bookworm with python3 and import it into Docker.
#
# Used when python:3.12-slim cannot be pulled (no Docker Hub here). Only Debian's package
# mirror is needed: the same one the host's apt uses, or $FARM_DEBIAN_MIRROR.
# Idempotent: does nothing when the image exists, unless --force.
#
# usage: images/base/build.sh [--force]
set -euo pipefail

IMAGE=farm-base:bookworm
SUITE=bookworm
# minbase already has passwd (useradd/groupadd, Priority: required); python3 is all we add.
INCLUDE=python3
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

log() { printf 'build-base: %s\n' "$*" >&2; }

force=0
case "${1:-}" in
    --force) force=1 ;;
    "") ;;
    *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

if [ "$force" -eq 0 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists (use --force to rebuild)"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || { log "debootstrap needs root"; exit 1; }
command -v debootstrap >/dev/null || { log "debootstrap is missing: run scripts/bootstrap"; exit 1; }

# The Debian mirror the host's apt already reaches (deb822 'URIs:' or one-line 'deb' form).
host_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        sed -n -E -e 's/^URIs:[[:space:]]*([^[:space:]]+).*/\1/p' \
            -e 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+(bookworm|stable)[[:space:]].*/\2/p' "$f"
    done | grep -E '/debian/?$' | head -n 1
}
MIRROR="${FARM_DEBIAN_MIRROR:-$(host_mirror || true)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

workdir="$(mktemp -d "${TMPDIR:-/var/tmp}/farm-base.XXXXXX")"
cleanup() {
    # debootstrap mounts proc/sys inside the target; never rm -rf through a live mount.
    local m
    for m in $(awk -v d="$workdir" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf --one-file-system "$workdir"
}
trap cleanup EXIT

rootfs="$workdir/rootfs"
log "debootstrap $SUITE from $MIRROR (a few minutes)"
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$rootfs" "$MIRROR" >"$workdir/debootstrap.log" 2>&1 || {
    tail -n 30 "$workdir/debootstrap.log" >&2
    log "debootstrap failed"
    exit 1
}

# Keep the image small: no package caches, lists, docs, man pages or translations; and keep later
# apt installs in derived images (e.g. python3-pip) from adding docs back.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* \
    "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/farm-nodoc" <<'CFG'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$rootfs/etc/apt/apt.conf.d/90farm-norecommends"

log "importing $IMAGE"
tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'LABEL farm.managed=1 farm.image=base' \
        --change 'CMD ["python3"]' \
        - "$IMAGE" >/dev/null
log "built $IMAGE"
