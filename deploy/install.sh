#!/usr/bin/env bash
# Installs aenv on a Debian 12 host as systemd services (docs/deploy.md). Idempotent: run
# it again to upgrade aenv or add a role; it never overwrites /etc/aenv/aenv.env. Each run
# installs into a new venv and switches /opt/aenv/current to it (deploy/venvs.sh).
set -euo pipefail
umask 022  # the venvs must be readable by the API's user aenv

usage() {
    cat <<'EOF'
Usage: deploy/install.sh [--role api|node|both] [--source DIR|WHEEL] [--keep N] [--no-start]

Installs aenv on this Debian 12 machine (as root):
  * system packages (python3-venv; for a node also QEMU, iptables, e2fsprogs, skopeo,
    busybox-static, debootstrap, cpio, kmod, zstd),
  * the system user `aenv` and /opt/aenv (code), /var/lib/aenv (state), /etc/aenv (config),
  * aenv from DIR (a source checkout) or WHEEL, with the exact versions of constraints.txt,
    into a new venv /opt/aenv/venvs/VERSION-TIME; once it works, the link /opt/aenv/current
    (what the units run) is switched to it in one step, and all but the N newest venvs go,
  * deploy/systemd/aenv-<role>.service into /etc/systemd/system, and the environment
    file template as /etc/aenv/aenv.env (only when there is none yet),
  * then `systemctl enable --now` each role, once /etc/aenv/aenv.env holds no
    REPLACE-ME placeholder any more (before that: enabled, not started).

Options:
  --role api|node|both   which role(s) this machine runs (default: both)
  --source DIR|WHEEL     what to pip install (default: the checkout holding this script)
  --keep N               venvs kept under /opt/aenv/venvs, the current one included
                         (default: 3; at least 2: the running services' own until restarted)
  --no-start             install and enable, but do not start or restart anything
  -h, --help             this help
EOF
}

ROLE=both
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCE=$(dirname "$HERE")
START=1
KEEP=3
while (($#)); do
    case "$1" in
        --role) ROLE=${2:?--role needs api, node or both}; shift 2 ;;
        --role=*) ROLE=${1#--role=}; shift ;;
        --source) SOURCE=${2:?--source needs a directory or a wheel}; shift 2 ;;
        --source=*) SOURCE=${1#--source=}; shift ;;
        --keep) KEEP=${2:?--keep needs a number}; shift 2 ;;
        --keep=*) KEEP=${1#--keep=}; shift ;;
        --no-start) START=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$ROLE" in
    api) ROLES=(api) ;;
    node) ROLES=(node) ;;
    both) ROLES=(api node) ;;
    *) echo "install.sh: --role must be api, node or both, not '$ROLE'" >&2; exit 2 ;;
esac
if [ ! -d "$SOURCE" ] && [[ "$SOURCE" != *.whl || ! -f "$SOURCE" ]]; then
    echo "install.sh: --source $SOURCE is neither a directory nor a .whl file" >&2
    exit 2
fi
if [[ ! "$KEEP" =~ ^[0-9]+$ ]] || ((KEEP < 2)); then
    echo "install.sh: --keep must be a number of at least 2, not '$KEEP'" >&2
    exit 2
fi
# the exact versions to install: the source checkout's, else those beside this script
CONSTRAINTS=$SOURCE/constraints.txt
[ -f "$CONSTRAINTS" ] || CONSTRAINTS=$(dirname "$HERE")/constraints.txt
if [ ! -f "$CONSTRAINTS" ]; then
    echo "install.sh: no constraints.txt in $SOURCE or beside deploy/" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "install.sh: run as root (it installs packages, a user and systemd units)" >&2
    exit 1
fi

PREFIX=/opt/aenv
STATE=/var/lib/aenv
CONF=/etc/aenv
UNITS=/etc/systemd/system
say() { echo "install.sh: $*"; }
# shellcheck source-path=SCRIPTDIR source=venvs.sh
. "$HERE/venvs.sh"

# --- system packages ------------------------------------------------------------------
pkgs=(python3-venv ca-certificates)
for r in "${ROLES[@]}"; do
    if [ "$r" = node ]; then
        pkgs+=(qemu-system-x86 qemu-utils iptables e2fsprogs skopeo busybox-static
               debootstrap cpio kmod util-linux
               zstd)  # zstd-compressed OCI image layers (templates from registries)
    fi
done
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- user and directories -------------------------------------------------------------
if ! getent passwd aenv >/dev/null; then
    say "creating system user aenv"
    useradd --system --user-group --home-dir "$STATE" --no-create-home \
        --shell /usr/sbin/nologin --comment "aenv sandbox platform" aenv
fi
install -d -m 0755 -o root -g root "$PREFIX" "$PREFIX/doc"
install -d -m 0750 -o aenv -g aenv "$STATE"   # the API's state; the node (root) adds node/, images/
install -d -m 0750 -o root -g aenv "$CONF"    # aenv may read its config, not change it

# --- aenv itself ----------------------------------------------------------------------
# A new venv: the running services keep theirs until they restart (deploy/venvs.sh).
say "installing aenv from $SOURCE (constraints: $CONSTRAINTS)"
if ! NEW=$(new_venv "$PREFIX" "$SOURCE" "$CONSTRAINTS"); then
    echo "install.sh: the install failed; $PREFIX/current and the services are unchanged" >&2
    exit 1
fi
# the entry point the units run must work, and the API migrates its database at start: the
# revisions must be where Alembic looks (-I: the venv's code, not a checkout in the cwd)
if ! version=$("$NEW/bin/aenv" --version) || ! "$NEW/bin/python" -I - <<'EOF'
from alembic.script import ScriptDirectory
from projections.db import alembic_config
raise SystemExit(0 if ScriptDirectory.from_config(alembic_config()).get_heads() else 1)
EOF
then
    rm -rf "$NEW"
    echo "install.sh: $NEW does not run aenv or lacks its schema migrations: removed;" \
         "$PREFIX/current and the services are unchanged" >&2
    exit 1
fi
say "installed $version into $NEW"

# --- configuration and units ----------------------------------------------------------
if [ ! -e "$CONF/aenv.env" ]; then
    say "writing $CONF/aenv.env from the template: edit it before the services can start"
    install -m 0640 -o root -g aenv "$HERE/systemd/aenv.env.example" "$CONF/aenv.env"
else
    chown root:aenv "$CONF/aenv.env"
    chmod 0640 "$CONF/aenv.env"
fi
if [ -f "$HERE/../docs/deploy.md" ]; then   # the units' Documentation=
    install -m 0644 "$HERE/../docs/deploy.md" "$PREFIX/doc/deploy.md"
fi
for r in "${ROLES[@]}"; do
    install -m 0644 "$HERE/systemd/aenv-$r.service" "$UNITS/aenv-$r.service"
done
# the units run $PREFIX/current: from here on a (re)start runs the new venv
switch_current "$PREFIX" "$NEW"
say "$PREFIX/current -> $(readlink "$PREFIX/current")"
prune_venvs "$PREFIX" "$KEEP"
if [ -e "$PREFIX/venv" ]; then
    say "note: $PREFIX/venv and $PREFIX/src (before versioned venvs) are no longer used"
fi

if [ "$ROLE" != api ] && [ ! -c /dev/kvm ]; then
    say "note: no /dev/kvm here: the node will run its VMs under TCG (slow)"
fi

if ! command -v systemctl >/dev/null || [ ! -d /run/systemd/system ]; then
    say "systemd is not running here: units installed, nothing enabled"
    exit 0
fi
systemctl daemon-reload
units=()
for r in "${ROLES[@]}"; do units+=("aenv-$r.service"); done
if grep -q "REPLACE-ME" "$CONF/aenv.env"; then
    systemctl enable "${units[@]}"
    say "enabled ${units[*]}; not started: $CONF/aenv.env still has REPLACE-ME values."
    say "edit it, then: systemctl start ${units[*]}"
elif ((START)); then
    systemctl enable "${units[@]}"
    # restart, not just start: a re-run after an upgrade must load the new code
    systemctl restart "${units[@]}"
    say "running: ${units[*]} (journalctl -u aenv-api -u aenv-node -f)"
else
    systemctl enable "${units[@]}"
    say "enabled ${units[*]} (not started: --no-start)"
fi
