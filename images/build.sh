#!/usr/bin/env bash
# Build the three images (operator, engine builder, Triton runtime) from the repository root.
#   images/build.sh              build all three (needs a Docker engine; the two NGC-based ones are ~20 GB)
#   images/build.sh --dry-run    print the commands, then check no build context or wheel holds a test double
#   images/build.sh --push       build, then push to $REGISTRY
#   IMAGES="operator" images/build.sh      build a subset (operator engine-builder triton-runtime)
# Versions come from images/versions.env; the tags are the operator's default images (api/spec.py).
# Without a reachable Docker engine it explains and exits 0 (REQUIRE_DOCKER=1 makes that an error).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=versions.env
. images/versions.env
REGISTRY="${REGISTRY_OVERRIDE:-$REGISTRY}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
IMAGES="${IMAGES:-operator engine-builder triton-runtime}"
DRY_RUN=0
PUSH=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --push) PUSH=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

tag_of() {
  case "$1" in
    operator) echo "${REGISTRY}/redrafter-operator:${VERSION}" ;;
    engine-builder) echo "${REGISTRY}/engine-builder:${VERSION}-trtllm${TRTLLM_VERSION}" ;;
    triton-runtime) echo "${REGISTRY}/triton-runtime:${VERSION}-${TRITON_RELEASE}-trtllm-python-py3" ;;
    *) echo "unknown image: $1" >&2; exit 2 ;;
  esac
}

commands=()
contexts=""
for image in $IMAGES; do
  tag="$(tag_of "$image")"
  dockerfile="$image"
  args="--build-arg VERSION=${VERSION} --build-arg PYTHON_IMAGE=${PYTHON_IMAGE}"
  if [ "$image" != operator ]; then
    args="${args} --build-arg TRITON_RELEASE=${TRITON_RELEASE} --build-arg TRTLLM_VERSION=${TRTLLM_VERSION}"
  fi
  case " $contexts " in *" $dockerfile "*) ;; *) contexts="${contexts:+$contexts }$dockerfile" ;; esac
  commands+=("docker build --file images/${dockerfile}.Dockerfile --tag ${tag} ${args} .")
  if [ "$PUSH" = 1 ]; then commands+=("docker push ${tag}"); fi
done

if [ "$DRY_RUN" = 1 ]; then
  printf '%s\n' "${commands[@]}"
  # Prove what the images can contain: each build context and the wheel built from it hold no test double.
  PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
  # shellcheck disable=SC2086
  exec "$PYTHON" images/check_context.py $contexts
fi

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  cat >&2 <<MSG
make images: skipped, no reachable Docker engine here ($(command -v docker >/dev/null 2>&1 && echo "docker client found, engine not reachable" || echo "no docker client")).
On a machine with Docker (and ~60 GB free: the NGC bases nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3
are large), run from the repository root:
MSG
  printf '  %s\n' "${commands[@]}" >&2
  if [ "${REQUIRE_DOCKER:-0}" = 1 ]; then exit 1; fi
  exit 0
fi

export DOCKER_BUILDKIT=1  # per-Dockerfile .dockerignore files need BuildKit
for cmd in "${commands[@]}"; do
  echo "+ $cmd"
  eval "$cmd"
done
