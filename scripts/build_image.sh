#!/usr/bin/env bash
# Builds the worker image for real with Docker on this machine (no Docker Hub: the
# base is made locally) and runs it against the fake RunPod control plane:
#   1. dockerd: used when running, else started here (and stopped at the end);
#      docker.io / debootstrap are installed with apt-get only when missing, and
#      it says so first
#   2. the base image BASE_IMAGE (default local/debian:bookworm-minbase): when
#      absent, imported from the cached tarball, or made with
#      `debootstrap --variant=minbase bookworm` and cached (IMAGE_CACHE_DIR)
#   3. docker/Dockerfile built with BuildKit on the host network: CPU torch
#      (TORCH_INDEX_URL empty: the torch wheel and indexes of this machine's pip
#      configuration, served by docker/hostpip.py and passed in as the secrets
#      pip_conf / pip_cert), the embedded default model baked
#   4. the image's size and its big layers
#   5. docker/run_image_jobs.py: the container on the host network against the
#      fake control plane, the cold start to the first token and every job's ending
#
#   bash scripts/build_image.sh
# Environment: IMAGE (default runpod-llm-worker:cpu), DOCKERFILE (default
# docker/Dockerfile; the context is the repository either way), BASE_IMAGE, IMAGE_CACHE_DIR
# (default /var/cache/runpod-llm-worker-image), DEBIAN_MIRROR, PYTHON (for the
# helper scripts; default python3), BUILD_ONLY=1 (skip step 5).
# Exit status: 0 built and every job ended as expected; 1 the build or a job
# failed; 3 Docker cannot run here (nothing was built: .ci/run falls back to the
# rehearsal on 3 only).
set -euo pipefail

main() {
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
image=${IMAGE:-runpod-llm-worker:cpu}
dockerfile=${DOCKERFILE:-docker/Dockerfile}
base=${BASE_IMAGE:-local/debian:bookworm-minbase}
cache=${IMAGE_CACHE_DIR:-/var/cache/runpod-llm-worker-image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
py=${PYTHON:-python3}
t_all=$(date +%s)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/build-image.XXXXXX")
dockerd_pid='' hostpip_pid=''
trap cleanup EXIT
mkdir -p "$cache"
declare -a timings=()

say() { echo "build_image: $*"; }
unavailable() { say "Docker cannot run here: $*"; exit 3; }
timed() { timings+=("$(printf '%-34s %5ss' "$1" $(( $(date +%s) - $2 )))"); }

# -- 1. the engine -----------------------------------------------------------------
t=$(date +%s)
missing=()
command -v dockerd > /dev/null || missing+=(docker.io)
if ! docker image inspect "$base" > /dev/null 2>&1 && [ ! -f "$cache/debian-bookworm-minbase.tar" ] \
        && [ "$base" = local/debian:bookworm-minbase ] && ! command -v debootstrap > /dev/null; then
    missing+=(debootstrap)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
        unavailable "${missing[*]} missing, and no apt-get as root to install it"
    fi
    say "installing ${missing[*]} with apt-get (missing here)"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } > "$tmp/apt.log" 2>&1 \
        || { tail -n 20 "$tmp/apt.log"; unavailable "apt-get install ${missing[*]} failed"; }
fi
if docker info > /dev/null 2>&1; then
    say "using the running dockerd"
else
    [ "$(id -u)" = 0 ] || unavailable "dockerd is not running and this is not root"
    say "starting dockerd (log: $cache/dockerd.log; stopped at the end)"
    dockerd > "$cache/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 0.5; done
    docker info > /dev/null 2>&1 || { tail -n 15 "$cache/dockerd.log"; unavailable "dockerd did not start"; }
fi
# a client that builds with BuildKit: buildx, or a classic one (< 23) with DOCKER_BUILDKIT=1
builder=''
for cli in docker /usr/bin/docker; do
    command -v "$cli" > /dev/null || continue
    if "$cli" buildx version > /dev/null 2>&1; then builder="$cli buildx build --load"; break; fi
    major=$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1) || true
    if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then builder="$cli build"; break; fi
done
[ -n "$builder" ] || unavailable "no Docker client here builds with BuildKit (install buildx)"
say "$(docker version --format 'engine {{.Server.Version}}, storage {{.Server.Os}}') ($(docker info --format '{{.Driver}}')); building with: $builder"
timed "1. dockerd" "$t"

# -- 2. the base image -------------------------------------------------------------
t=$(date +%s)
if docker image inspect "$base" > /dev/null 2>&1; then
    say "base image $base: present"
elif [ "$base" = local/debian:bookworm-minbase ]; then
    tarball=$cache/debian-bookworm-minbase.tar
    if [ ! -f "$tarball" ]; then
        say "making the base: debootstrap --variant=minbase bookworm (cached as $tarball)"
        debootstrap --variant=minbase bookworm "$tmp/rootfs" "$mirror" > "$tmp/debootstrap.log" 2>&1 \
            || { tail -n 20 "$tmp/debootstrap.log"; say "FAILED: debootstrap"; exit 1; }
        tar -C "$tmp/rootfs" -c . > "$tarball.partial" && mv "$tarball.partial" "$tarball"
        rm -rf "$tmp/rootfs"
    fi
    say "importing $tarball as $base"
    docker import - "$base" < "$tarball" > /dev/null
else
    say "FAILED: BASE_IMAGE $base is not in the engine's store (no registry is reachable)"
    exit 1
fi
timed "2. base image" "$t"

# -- 3. the build ----------------------------------------------------------------
t=$(date +%s)
"$py" docker/hostpip.py "$tmp/pip" 2> "$tmp/hostpip.log" &
hostpip_pid=$!
for _ in $(seq 50); do [ -f "$tmp/pip/port" ] && break; sleep 0.2; done
[ -f "$tmp/pip/port" ] || { cat "$tmp/hostpip.log"; say "FAILED: docker/hostpip.py did not start"; exit 1; }
secrets=(--secret "id=pip_conf,src=$tmp/pip/pip.conf")
[ -f "$tmp/pip/pip_cert" ] && secrets+=(--secret "id=pip_cert,src=$tmp/pip/pip_cert")
say "docker build $image from $dockerfile on $base (log: $cache/build-${image//[:\/]/-}.log)"
# shellcheck disable=SC2086  # $builder is a command and its flags
if ! DOCKER_BUILDKIT=1 $builder --progress=plain --network host -f "$dockerfile" \
        --build-arg BASE_IMAGE="$base" --build-arg TORCH_INDEX_URL= "${secrets[@]}" -t "$image" . \
        > "$cache/build-${image//[:\/]/-}.log" 2>&1; then
    tail -n 40 "$cache/build-${image//[:\/]/-}.log"
    say "FAILED: docker build"
    exit 1
fi
grep -cE '^#[0-9]+ CACHED' "$cache/build-${image//[:\/]/-}.log" | sed 's/^/build_image: steps taken from the cache: /' || true
kill "$hostpip_pid" 2> /dev/null || true
hostpip_pid=''
timed "3. docker build" "$t"

# -- 4. size and layers ------------------------------------------------------------
size=$(docker image inspect -f '{{.Size}}' "$image")
say "image $image: $(( size / 1000000 )) MB; layers over 1 MB:"
docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" \
    | awk -F'\t' '$1 ~ /[MG]B$/ && $1+0 >= 1 { sub(/^\/bin\/sh -c /, "", $2); sub(/^\|[0-9]+ [^ ]* /, "", $2); printf "  %9s  %.110s\n", $1, ($2 == "" ? "(the base image)" : $2) }'

# -- 5. the container against the fake control plane -------------------------------
status=0
if [ "${BUILD_ONLY:-0}" = 1 ]; then
    say "BUILD_ONLY=1: the container is not run"
else
    t=$(date +%s)
    "$py" docker/run_image_jobs.py "$image" || status=1
    timed "5. container jobs" "$t"
fi
echo
say "$( [ "$status" = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - t_all ))s"
printf '  %s\n' "${timings[@]}"
return "$status"
}

# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    [ -z "$hostpip_pid" ] || kill "$hostpip_pid" 2> /dev/null || true
    if [ -n "$dockerd_pid" ]; then
        echo "build_image: stopping the dockerd started here"
        kill "$dockerd_pid" 2> /dev/null || true
        for _ in $(seq 40); do kill -0 "$dockerd_pid" 2> /dev/null || break; sleep 0.5; done
    fi
    rm -rf "$tmp"
}

# on one line: bash has read it whole before main runs
main "$@"; exit $?
