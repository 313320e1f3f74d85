#!/bin/sh
# edgelm offline installer: verifies SHA256SUMS, then installs the static binary, the model,
# the profile and the systemd files. Needs only a POSIX shell and coreutils.
#
#   ./install.sh                 install into / (as root); starts the service under systemd
#   ./install.sh --root DIR      install into DIR instead (or: DESTDIR=DIR ./install.sh)
#   ./install.sh --no-start      install and enable, but do not start
#
# Layout: /usr/bin/edgelm, /etc/systemd/system/edgelm.service, /etc/sysusers.d/edgelm.conf,
# /etc/tmpfiles.d/edgelm.conf, /etc/default/edgelm, /etc/edgelm/profile.toml (model.path set to
# /var/lib/edgelm/models/MODEL), /var/lib/edgelm/models/MODEL.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=${DESTDIR:-}
start=1
while [ $# -gt 0 ]; do
    case "$1" in
        --root|--prefix|--destdir) root=$2; shift 2 ;;
        --root=*|--prefix=*|--destdir=*) root=${1#*=}; shift ;;
        --no-start) start=0; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
root=${root%/}
real_root=0
[ -z "$root" ] && real_root=1

cd "$here"
echo "==> verifying SHA256SUMS"
if ! sha256sum -c --quiet --strict SHA256SUMS; then
    echo "install.sh: checksum mismatch; the bundle is damaged, nothing was installed" >&2
    exit 1
fi

model=$(ls models/*.gguf | head -1)
model_name=$(basename "$model")
state=/var/lib/edgelm

echo "==> installing into ${root:-/}"
install -d -m 0755 "$root/usr/bin" "$root/etc/edgelm" "$root/etc/systemd/system" \
    "$root/etc/sysusers.d" "$root/etc/tmpfiles.d" "$root/etc/default" "$root$state"
install -d -m 0750 "$root$state/models"
install -m 0755 bin/edgelm "$root/usr/bin/edgelm"
install -m 0644 systemd/edgelm.service "$root/etc/systemd/system/edgelm.service"
install -m 0644 systemd/edgelm.sysusers "$root/etc/sysusers.d/edgelm.conf"
install -m 0644 systemd/edgelm.tmpfiles "$root/etc/tmpfiles.d/edgelm.conf"
# Keep an existing /etc/default/edgelm (it may hold the API key).
[ -e "$root/etc/default/edgelm" ] || install -m 0644 systemd/edgelm.default "$root/etc/default/edgelm"
# A new file beside the served one, renamed over it: a running server keeps reading the old
# file (its mapping stays on the old inode) until it reloads or restarts, never a half-written
# one.
install -m 0644 "$model" "$root$state/models/$model_name.new"
mv -f "$root$state/models/$model_name.new" "$root$state/models/$model_name"

# The profile, with model.path pointing at the installed model. An existing different
# profile is kept as profile.toml.old.
tmp=$(mktemp)
awk -v model="$state/models/$model_name" '
    /^[[:space:]]*\[/ { in_model = ($0 ~ /^[[:space:]]*\[model\]/) }
    in_model && !done && /^[[:space:]]*path[[:space:]]*=/ { print "path = \"" model "\""; done = 1; next }
    { print }' profile.toml > "$tmp"
if [ -e "$root/etc/edgelm/profile.toml" ] && ! cmp -s "$tmp" "$root/etc/edgelm/profile.toml"; then
    cp -p "$root/etc/edgelm/profile.toml" "$root/etc/edgelm/profile.toml.old"
    echo "    kept the previous profile as /etc/edgelm/profile.toml.old"
fi
install -m 0644 "$tmp" "$root/etc/edgelm/profile.toml"
rm -f "$tmp"

if [ "$real_root" = 1 ]; then
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers edgelm.conf
    elif command -v useradd >/dev/null 2>&1 && ! getent passwd edgelm >/dev/null 2>&1; then
        useradd --system --user-group --home-dir "$state" --no-create-home \
            --shell /usr/sbin/nologin edgelm
    fi
    if getent passwd edgelm >/dev/null 2>&1; then
        chown -R edgelm:edgelm "$state"
    fi
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles --create edgelm.conf || true
    fi
fi

if [ "$real_root" = 1 ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable edgelm.service
    if [ "$start" = 1 ]; then
        systemctl restart edgelm.service
        echo "==> edgelm.service started: systemctl status edgelm"
    else
        echo "==> enabled; start it with: systemctl start edgelm"
    fi
else
    echo "==> installed. systemd is not running here (or this is not the real root); start with:"
    if [ "$real_root" = 1 ]; then
        echo "    /usr/bin/edgelm serve --config /etc/edgelm/profile.toml"
    else
        echo "    chroot $root /usr/bin/edgelm serve --config /etc/edgelm/profile.toml"
        echo "    (or, once booted into it: systemctl enable --now edgelm)"
    fi
fi
