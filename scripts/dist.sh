#!/usr/bin/env bash
# `make dist`: the release artifacts — the wheel and the sdist of the distribution
# `aenv-platform` (`aenv` on PyPI is an unrelated project), and SHA256SUMS over both — in
# $DIST (default: dist/; earlier artifacts there are removed first).
#   scripts/dist.sh            # then: cd dist && sha256sum -c SHA256SUMS
# Built by PyPA's `build` without isolation, in a venv of its own holding pinned `build` and
# `setuptools` (the project's venv is not changed): made once per machine in the cache
# scripts/setup.sh keeps its side environments in, so a build needs no index after the first.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_PINS=(build==1.6.1 setuptools==84.2.1)
PY=${PYTHON:-python3}
DIST=${DIST:-dist}
CACHE=${AENV_SETUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/aenv-setup}
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
tools=$CACHE/venv-dist-$(IFS=-; echo "${BUILD_PINS[*]}" | tr -d '=')-py$PYV
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # another clone making the same environment: wait for it
if [ ! -e "$tools/.aenv-complete" ]; then
    echo "dist: making $tools (${BUILD_PINS[*]})" >&2
    rm -rf "$tools"
    "$PY" -m venv "$tools"
    "$tools/bin/pip" install -q "${BUILD_PINS[@]}"
    touch "$tools/.aenv-complete"
fi
exec 9>&-
mkdir -p "$DIST"
rm -f "$DIST"/aenv_platform-* "$DIST/SHA256SUMS"  # a stale artifact must not be summed
# the sdist first, then the wheel built from it: a file the sdist lacks fails here
"$tools/bin/python" -m build --no-isolation --outdir "$DIST" . >&2
(cd "$DIST" && sha256sum -- *.whl *.tar.gz > SHA256SUMS)
echo "dist: $(cd "$DIST" && echo *.whl *.tar.gz) and SHA256SUMS in $DIST" >&2
