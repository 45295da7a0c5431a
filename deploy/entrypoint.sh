#!/bin/sh
# Entrypoint of the cosyvino image (deploy/Containerfile; docs/deploy.md).
#
#   (no arguments)    serve: with the plan of $COSYVINO_PLAN (or ./plan.toml) when there is
#                     one, else with a plan made now inside this container (its CPU set, CPU
#                     quota and memory limit), so threads never exceed the container's CPUs
#   --flag ...        the same, with extra `cosyvino serve` flags (`serve --flag ...` too)
#   COMMAND ...       any other cosyvino command, e.g. `plan --emit k8s --no-write`
set -eu
case "${1:-}" in
  ""|-*) ;;
  serve) shift ;;
  *) exec cosyvino "$@" ;;
esac
if [ -z "${COSYVINO_PLAN:-}" ] && [ ! -f plan.toml ]; then
  cosyvino plan --model-dir "${COSYVINO_MODEL_DIR:-/models/cosyvino}" \
    --out /tmp/cosyvino-plan.toml >&2
  COSYVINO_PLAN=/tmp/cosyvino-plan.toml
  export COSYVINO_PLAN
fi
exec cosyvino serve --host "${COSYVINO_HOST:-0.0.0.0}" "$@"
