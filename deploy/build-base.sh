#!/bin/sh
# Build a local stand-in for `python:3.11-slim` from Debian packages, for machines that cannot
# reach an image registry (docs/deploy.md, "Building without a registry").
#
#   sudo deploy/build-base.sh [IMAGE]        # default IMAGE: localhost/cosyvino-base:bookworm
#
# Needs: debootstrap, podman (Debian: apt-get install debootstrap podman) and a Debian mirror
# ($DEBIAN_MIRROR, default http://deb.debian.org/debian). The image is Debian 12 minbase with
# python3 (3.11), python3-venv and CA certificates: what deploy/Containerfile needs of its base.
set -eu
IMAGE=${1:-localhost/cosyvino-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$work/rootfs" "$MIRROR"
# no apt lists or caches in the image
rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin
tar -C "$work/rootfs" -c . | podman import --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
echo "built $IMAGE"
