#!/usr/bin/env bash
# Prints the base image every Dockerfile of the repo builds FROM (their `ARG BASE`), making it first when
# needed:
#   - $FAITHPROXY_BASE when set (an image that is already here or can be pulled);
#   - else python:3.11-slim, when it is here or Docker Hub answers a pull;
#   - else faithproxy-base/debian-python:bookworm, made here from Debian packages (debootstrap: python3,
#     venv, pip and CA certificates, nothing else), for machines that reach Debian's archive and PyPI but
#     no container registry. Made once; delete the image to make it again.
# The made base trusts this machine's CA certificates (its ca-certificates.crt replaces Debian's): a
# property of the network the build runs in, so it is done here and never in a Dockerfile.
# Progress goes to stderr; stdout is the image name only:  BASE=$(scripts/docker_base.sh)
set -euo pipefail
OFFICIAL=python:3.11-slim
LOCAL=faithproxy-base/debian-python:bookworm
SUITE=bookworm

have() { docker image inspect "$1" >/dev/null 2>&1; }

if [ -n "${FAITHPROXY_BASE:-}" ]; then
  have "$FAITHPROXY_BASE" || docker pull "$FAITHPROXY_BASE" >&2
  echo "$FAITHPROXY_BASE"
  exit 0
fi
if have "$OFFICIAL" || timeout 60 docker pull "$OFFICIAL" >/dev/null 2>&1; then
  echo "$OFFICIAL"
  exit 0
fi
if have "$LOCAL"; then
  echo "$LOCAL"
  exit 0
fi

echo "$OFFICIAL cannot be pulled: making $LOCAL with debootstrap" >&2
if ! command -v debootstrap >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi
mirror=http://deb.debian.org/debian
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
elif [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
fi
rootfs=$(mktemp -d /tmp/faithproxy-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  "$SUITE" "$rootfs" "$mirror" >&2
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
# apt inside the image uses the same mirror as this machine; no package lists are shipped.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$LOCAL" >&2
echo "$LOCAL"
