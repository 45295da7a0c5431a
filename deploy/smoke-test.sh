#!/bin/sh
# Build deploy/Containerfile and check that the image serves speech on 127.0.0.1, as a
# Kubernetes pod would run it (non-root, read-only root filesystem, SIGTERM drain).
#
#   deploy/smoke-test.sh [PORT]                 # default port 18080; run from anywhere
#
# Environment: IMAGE (default localhost/cosyvino:smoke), BASE_IMAGE (default
# localhost/cosyvino-base:bookworm, from deploy/build-base.sh; or docker.io/library/python:3.11-slim
# where a registry is reachable), MODEL_PRESET (default tiny), SKIP_BUILD=1 (reuse IMAGE),
# BUILD_ARGS (extra `buildah bud` arguments, e.g. a pip mirror: "--build-arg PIP_FIND_LINKS=/w
# -v /opt/wheels:/w:ro"), RUN_ARGS (extra `podman run` arguments). Needs podman, buildah, runc.
# docs/deploy.md says why it builds with chroot isolation and runs with runc and ulimits.
set -eu
PORT=${1:-18080}
IMAGE=${IMAGE:-localhost/cosyvino:smoke}
BASE_IMAGE=${BASE_IMAGE:-localhost/cosyvino-base:bookworm}
cd "$(dirname "$0")/.."
name=cosyvino-smoke-$$
fail() { echo "smoke test FAILED: $*" >&2; podman logs "$name" 2>&1 | tail -40 >&2 || true; exit 1; }
state=$(mktemp -d)
cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$state"; }
trap cleanup EXIT

if [ "${SKIP_BUILD:-}" != 1 ]; then
  # shellcheck disable=SC2086  # BUILD_ARGS is a list of arguments
  buildah bud --isolation chroot --format docker --pull=never -f deploy/Containerfile \
    --ignorefile deploy/Containerfile.dockerignore --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg MODEL_PRESET="${MODEL_PRESET:-tiny}" ${BUILD_ARGS:-} -t "$IMAGE" .
fi
podman image inspect --format '{{.Config.Healthcheck}}' "$IMAGE" | grep -q /health \
  || fail "image has no HEALTHCHECK on /health"
[ "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" != root ] \
  || fail "image runs as root"

# podman's default ulimits may be above what this process may set: use the current ones
nofile=$(awk '/^Max open files/ {print $5}' /proc/self/limits)
nproc=$(awk '/^Max processes/ {print $4}' /proc/self/limits)
case "$nproc" in unlimited) nproc=32768 ;; *) [ "$nproc" -le 32768 ] || nproc=32768 ;; esac
# the writable paths as volumes, the rest read-only (as the Kubernetes manifests run it)
mkdir -p "$state/voices" "$state/cache"
chmod 1777 "$state/voices" "$state/cache"
# shellcheck disable=SC2086
podman --runtime runc run -d --name "$name" --ulimit "nofile=$nofile:$nofile" \
  --ulimit "nproc=$nproc:$nproc" -p "127.0.0.1:$PORT:8000" --read-only --tmpfs /tmp \
  -v "$state/voices:/var/lib/cosyvino/voices" -v "$state/cache:/var/lib/cosyvino/cache" \
  ${RUN_ARGS:-} "$IMAGE" >/dev/null

url=http://127.0.0.1:$PORT
i=0
until curl -sf "$url/ready" >/dev/null; do
  i=$((i + 1)); [ $i -lt 300 ] || fail "/ready not 200 after 300 s"
  [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] || fail "container exited"
  sleep 1
done
echo "ready after ~$i s"
curl -sf "$url/health" >/dev/null || fail "/health"
# the image's HEALTHCHECK command itself (podman schedules it with systemd timers, when any)
podman healthcheck run "$name" >/dev/null 2>&1 || fail "HEALTHCHECK command failed"
[ "$(podman exec "$name" id -u)" != 0 ] || fail "server runs as root"
if podman exec "$name" python3 -c "import torch" 2>/dev/null; then fail "torch in the image"; fi
out=$(mktemp)
code=$(curl -s -o "$out" -w '%{http_code}' "$url/v1/audio/speech" \
  -H 'Content-Type: application/json' \
  -d '{"model":"tts-1","input":"Hello from the container.","voice":"英文女","response_format":"wav"}')
size=$(wc -c < "$out")
head -c 4 "$out" | grep -q RIFF || { rm -f "$out"; fail "speech: HTTP $code, not a WAV"; }
rm -f "$out"
[ "$code" = 200 ] && [ "$size" -gt 1000 ] || fail "speech: HTTP $code, $size bytes"
echo "speech: HTTP $code, $size bytes of WAV"
podman stop -t 30 "$name" >/dev/null
status=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$status" = 0 ] || fail "exit status $status after SIGTERM"
echo "smoke test passed: $IMAGE serves speech on $url, exits 0 on SIGTERM"
