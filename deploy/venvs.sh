# shellcheck shell=bash
# The versioned venvs deploy/install.sh installs aenv into, and the link the units run from.
#
# An upgrade must not change the code under running services: pip replacing files in the
# venv a role imports from leaves it half old, half new until the restart (and a failed
# install leaves it broken). So each install makes a new venv, PREFIX/venvs/VERSION-TIME,
# checks it, and only then points PREFIX/current at it with one rename(2): a process
# starting at any moment finds the old venv or the new one, never none and never a mix.
# The units run PREFIX/current/bin/aenv; going back is pointing the link at an older venv.
#
# Sourced by install.sh (which runs as root); tests/deploy/test_install_venvs.py drives
# these functions in a temporary prefix as an ordinary user.

# source_version SOURCE: the version of the aenv in a checkout (its pyproject.toml) or a
# wheel (its file name: NAME-VERSION-TAGS.whl)
source_version() {
    local src=$1 base
    if [ -d "$src" ]; then
        python3 -c 'import sys, tomllib
print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$src/pyproject.toml"
    else
        base=$(basename "$src")
        echo "$base" | cut -d- -f2
    fi
}

# new_venv PREFIX SOURCE CONSTRAINTS: makes PREFIX/venvs/VERSION-TIME, pip-installs SOURCE
# (a checkout or a wheel) into it under CONSTRAINTS, and prints its path. On a failure it
# removes what it made and returns 1: PREFIX/current and the venvs before are untouched.
new_venv() {
    local prefix=$1 src=$2 constraints=$3 version stamp dir n=1
    version=$(source_version "$src") || return 1
    [ -n "$version" ] || { echo "venvs.sh: no version in $src" >&2; return 1; }
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    dir=$prefix/venvs/$version-$stamp
    while [ -e "$dir" ]; do  # two installs within a second
        n=$((n + 1))
        dir=$prefix/venvs/$version-$stamp.$n
    done
    install -d -m 0755 "$prefix/venvs" || return 1
    if ! fill_venv "$dir" "$src" "$constraints" >&2; then
        rm -rf "$dir"
        return 1
    fi
    echo "$dir"
}

# fill_venv DIR SOURCE CONSTRAINTS: a new venv at DIR with SOURCE installed into it
fill_venv() {
    local dir=$1 src=$2 constraints=$3 tmp rc=0
    python3 -m venv "$dir" || return 1
    "$dir/bin/pip" install -q --upgrade pip || return 1
    if [ ! -d "$src" ]; then
        "$dir/bin/pip" install -q -c "$constraints" "$src"
        return
    fi
    # a checkout is built from a copy: pip builds inside the tree it is given (build/,
    # *.egg-info), and the venv must not depend on the checkout staying where it is
    tmp=$(mktemp -d) || return 1
    if tar -C "$src" --exclude=./.git --exclude='./.venv*' --exclude='./.npm-e2b*' \
        --exclude=__pycache__ --exclude='*.egg-info' --exclude=./build --exclude=./dist \
        --exclude=./var --exclude=./bench/results -cf - . | tar -C "$tmp" -xf -; then
        "$dir/bin/pip" install -q -c "$constraints" "$tmp" || rc=1
    else
        rc=1
    fi
    rm -rf "$tmp"
    return "$rc"
}

# switch_current PREFIX VENV: PREFIX/current -> venvs/NAME in one rename(2) (`ln -sfn`
# alone unlinks, then links: a start in between would find no venv)
switch_current() {
    local prefix=$1 venv=$2
    ln -sfn "venvs/$(basename "$venv")" "$prefix/current.new" \
        && mv -Tf "$prefix/current.new" "$prefix/current"
}

# prune_venvs PREFIX KEEP: removes all but the KEEP newest venvs; never the current one
prune_venvs() {
    local prefix=$1 keep=$2 current dir
    current=$(readlink -f "$prefix/current" 2>/dev/null || true)
    find "$prefix/venvs" -mindepth 1 -maxdepth 1 -type d -printf '%T@ %p\n' \
        | sort -rn | tail -n +"$((keep + 1))" | cut -d' ' -f2- \
        | while IFS= read -r dir; do
            [ "$(readlink -f "$dir")" = "$current" ] && continue
            echo "venvs.sh: removing the old venv $dir" >&2
            rm -rf "$dir"
        done
}
