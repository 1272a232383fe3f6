"""The two shell scripts that boot a guest: the initramfs `/init` and PID 1 `/opt/aenv/init`.

Both run under static busybox (no libc needed, and one exec per command is far cheaper
than util-linux under TCG). Their text is part of every image digest, so editing them
rebuilds images. Knobs arrive as environment variables: the kernel hands `key=value`
command-line parameters it does not know to init, and `switch_root` keeps the environment.

Console markers (the host driver greps the serial log for them):
  `AENV-INIT <uptime>`        PID 1 of the root filesystem started
  `AENV-INIT-FAIL <reason>`   the initramfs gave up; it powers off so QEMU exits
  `AENV-ENVD-EXIT <status>`   envd exited and is about to be restarted
  `ENVD-READY 49983`          printed by envd itself once it listens
"""

from __future__ import annotations

from collections.abc import Iterable

ENVD_PORT = 49983
#: envd's runtime disk (`runtime.py`), found by its label and mounted read-only here
RUNTIME_LABEL = "aenv-rt"
ROOT_LABEL = "root"
GUEST_INIT = "/opt/aenv/init"
GUEST_BUSYBOX = "/opt/aenv/bin/busybox"
ENVD_DIR = "/opt/aenv/envd"
GUEST_PYTHON = "/opt/aenv/python"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_INITRAMFS_HEAD = r"""#!/bin/busybox sh
# aenv initramfs /init. Kernel command-line knobs (arrive as env vars):
#   vmroot=ext4   root filesystem type on /dev/vda (only ext4 for now)
#   vmip=<cidr>   address for eth0, e.g. 169.254.0.21/30 (none: no network set up)
#   vmgw=<ip>     default gateway via eth0
#   vminit=<path> program to switch_root into (default /opt/aenv/init)
#   vmdebug=1     print progress markers to the console
B=/bin/busybox
export PATH=/bin
fail() {
  echo "AENV-INIT-FAIL $*" > /dev/console
  $B sync
  $B poweroff -f
  while :; do $B sleep 1; done
}
t() {
  [ "$vmdebug" = 1 ] || return 0
  echo "[aenv-initramfs $($B cut -d' ' -f1 /proc/uptime)] $*" > /dev/console
}
$B mount -t proc proc /proc || fail "mount /proc"
$B mount -t sysfs sysfs /sys || fail "mount /sys"
$B mount -t devtmpfs devtmpfs /dev || fail "mount /dev"
t start
ld() { $B insmod "/lib/modules/$1.ko" || fail "insmod $1"; }
ldo() { $B insmod "/lib/modules/$1.ko" 2>/dev/null || t "optional module $1 not loaded"; }
"""

_INITRAMFS_TAIL = r"""t modules-loaded
[ "${vmroot:-ext4}" = ext4 ] || fail "unsupported vmroot=$vmroot"
# two disks: the image's root and envd's runtime; which is which by label, not by order
i=0
while [ ! -b /dev/vda ] || [ ! -b /dev/vdb ]; do
  [ $i -ge 300 ] && fail "no /dev/vda and /dev/vdb (root and runtime disks not attached?)"
  $B usleep 10000; i=$((i+1))
done
rootdev=$($B findfs LABEL=root) || fail "no disk labelled root"
rtdev=$($B findfs LABEL=aenv-rt) || fail "no disk labelled aenv-rt (envd runtime)"
$B ip link set lo up || fail "cannot bring up lo"
if [ -n "$vmip" ]; then
  i=0
  while [ ! -e /sys/class/net/eth0 ]; do
    [ $i -ge 200 ] && fail "no eth0 (network device not attached?)"
    $B usleep 10000; i=$((i+1))
  done
  $B ip link set eth0 up || fail "cannot bring up eth0"
  $B ip addr add "$vmip" dev eth0 || fail "bad vmip=$vmip"
  if [ -n "$vmgw" ]; then
    $B ip route add default via "$vmgw" dev eth0 || fail "bad vmgw=$vmgw"
  fi
fi
t net-up
$B mount -t ext4 -o rw,noatime "$rootdev" /newroot || fail "cannot mount $rootdev as ext4"
# envd's runtime over /opt/aenv: the image's own files stay as they are
[ -d /newroot/opt/aenv ] || $B mkdir -p /newroot/opt/aenv || fail "cannot make /opt/aenv"
$B mount -t ext4 -o ro "$rtdev" /newroot/opt/aenv || fail "cannot mount the envd runtime"
vminit=${vminit:-/opt/aenv/init}
[ -e "/newroot$vminit" ] || fail "root filesystem has no $vminit"
t root-mounted
# pseudo filesystems are mounted here with static busybox: each util-linux mount exec'd
# from the root disk costs 0.1-0.2 s under TCG
t switch-root
for d in dev proc sys tmp run; do [ -d /newroot/$d ] || $B mkdir -p /newroot/$d; done
$B mount --move /dev /newroot/dev || fail "cannot move /dev"
$B mount --move /proc /newroot/proc || fail "cannot move /proc"
$B mount --move /sys /newroot/sys || fail "cannot move /sys"
$B mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp || fail "cannot mount /tmp"
$B mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run || fail "cannot mount /run"
$B mkdir -p /newroot/dev/pts /newroot/dev/shm
$B mount -t devpts -o ptmxmode=0666,mode=0620,gid=5 devpts /newroot/dev/pts || fail "devpts"
$B mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/dev/shm || fail "cannot mount /dev/shm"
exec $B switch_root /newroot "$vminit"
fail "switch_root to $vminit failed"
"""


def initramfs_init(modules: Iterable[tuple[str, bool]]) -> str:
    """The initramfs `/init`, loading `modules` ((name, required) pairs) in the given order."""
    lines = [f"{'ld' if required else 'ldo'} {name}" for name, required in modules]
    return _INITRAMFS_HEAD + "\n".join(lines) + "\n" + _INITRAMFS_TAIL


GUEST_INIT_SCRIPT = rf"""#!{GUEST_BUSYBOX} sh
# aenv guest PID 1: no systemd. Starts envd under a restart loop and reaps orphans. envd runs
# on the runtime's own Python, loader and libraries (never the image's).
B={GUEST_BUSYBOX}
export PATH={GUEST_PATH}
[ -s /etc/hostname ] && $B hostname -F /etc/hostname
# devtmpfs lacks these; bash process substitution and many tools expect them
[ -e /dev/fd ] || $B ln -s /proc/self/fd /dev/fd
[ -e /dev/stdin ] || $B ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || $B ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || $B ln -s /proc/self/fd/2 /dev/stderr
echo "AENV-INIT $($B cut -d' ' -f1 /proc/uptime)" > /dev/console
(
  while :; do
    cd /opt/aenv && $B env -i PATH={GUEST_PATH} HOME=/root USER=root LOGNAME=root \
      LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONHOME={GUEST_PYTHON} \
      {GUEST_PYTHON}/lib/ld-linux-x86-64.so.2 --library-path {GUEST_PYTHON}/lib \
      {GUEST_PYTHON}/bin/python3 -S -m envd --port {ENVD_PORT} \
      < /dev/null > /dev/console 2>&1
    echo "AENV-ENVD-EXIT $?" > /dev/console
    $B sleep 0.5
  done
) &
# An image's own services (the code interpreter's server): every executable in
# /etc/aenv/services, on the image's userland, as root, restarted like envd
for svc in /etc/aenv/services/*; do
  [ -f "$svc" ] && [ -x "$svc" ] || continue
  (
    while :; do
      $B env -i PATH={GUEST_PATH} HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 \
        "$svc" < /dev/null > /dev/console 2>&1
      echo "AENV-SERVICE-EXIT $svc $?" > /dev/console
      $B sleep 1
    done
  ) &
done
# PID 1 must reap re-parented orphans; ash's wait reaps any child while it blocks
while :; do wait; $B sleep 1; done
"""
