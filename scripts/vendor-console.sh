#!/usr/bin/env bash
# Refreshes the web console's vendored front-end files (api/console/static/vendor/) from npm.
# They are committed: the console is served by aenv itself, with no CDN and no build step at
# install or CI time. Run this only to move to other versions (edit the pins below), then
# commit the result; VERSIONS records what came from which package, with sha256 sums that
# tests/unit/api/test_console_assets.py checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PINS=(htmx.org@2.0.11 @xterm/xterm@6.0.0 @xterm/addon-fit@0.11.0)
OUT=api/console/static/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "${PINS[@]}" >/dev/null)
for tgz in "$tmp"/*.tgz; do
    mkdir -p "${tgz%.tgz}" && tar xzf "$tgz" -C "${tgz%.tgz}"
done
# package directory (as npm pack names it) : file in the package : name here
FILES=(
    "htmx.org-2.0.11:dist/htmx.min.js:htmx.min.js"
    "htmx.org-2.0.11:LICENSE:htmx.LICENSE"
    "xterm-xterm-6.0.0:lib/xterm.js:xterm.js"
    "xterm-xterm-6.0.0:css/xterm.css:xterm.css"
    "xterm-xterm-6.0.0:LICENSE:xterm.LICENSE"
    "xterm-addon-fit-0.11.0:lib/addon-fit.js:addon-fit.js"
    "xterm-addon-fit-0.11.0:LICENSE:addon-fit.LICENSE"
)
rm -rf "$OUT" && mkdir -p "$OUT"
{
    echo "# vendored by scripts/vendor-console.sh from npm: ${PINS[*]}"
    for f in "${FILES[@]}"; do
        IFS=: read -r pkg src dst <<<"$f"
        cp "$tmp/$pkg/package/$src" "$OUT/$dst"
        # source maps are not shipped: drop the pointer to one
        sed -i '/^\/\/# sourceMappingURL=/d' "$OUT/$dst"
        echo "$(sha256sum "$OUT/$dst" | cut -d' ' -f1)  $dst  ($pkg $src)"
    done
} > "$OUT/VERSIONS"
echo "vendor-console: ok ($OUT)" >&2
