#!/bin/sh
# Install Prexy's systemd service from a checkout (the steps at the top of
# conf/prexy.service; run as root, after Prexy itself is installed in the
# virtualenv /opt/prexy):
#
#   - the system user `prexy` the units run as (made when missing);
#   - conf/prexy.service and conf/prexy.socket in /etc/systemd/system;
#   - /etc/prexy: prexy.toml (listening on the socket prexy.socket passes,
#     `systemd:domain=INET:name=http`), the site files of sites.d/, and the
#     rules and map files; a file already there is kept, so running it again
#     (an upgrade) never overwrites an operator's configuration;
#   - README.md and docs/ in /usr/local/share/doc/prexy (the units' Documentation=).
#
# ROOT=DIR installs under DIR instead of / (a package build, a test's
# scratch root); no user is made then.  Exits non-zero on the first failure.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=${ROOT:-/}
root=${root%/}

# The systemd unit runs /opt/prexy/bin/twistd; a missing one is the usual
# mistake (the venv step skipped), and the service would not start.
if [ ! -x "$root/opt/prexy/bin/twistd" ]; then
    echo "install.sh: $root/opt/prexy/bin/twistd is missing: first" >&2
    echo "  python3 -m venv /opt/prexy && /opt/prexy/bin/pip install ." >&2
    exit 1
fi

if [ -z "$root" ]; then
    if ! getent passwd prexy >/dev/null; then
        useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin prexy
    fi
fi

install -d -m 755 "$root/etc/systemd/system"
install -m 644 "$here/prexy.service" "$here/prexy.socket" "$root/etc/systemd/system/"

# keep FILE DEST: install FILE as DEST unless DEST exists.
keep() {
    if [ -e "$2" ]; then
        echo "install.sh: keeping $2" >&2
    else
        install -m 644 "$1" "$2"
    fi
}

etc="$root/etc/prexy"
install -d -m 755 "$etc" "$etc/sites.d"
if [ ! -e "$etc/prexy.toml" ]; then
    # The example configuration, listening on systemd's socket instead of
    # the example's loopback port.
    sed 's|^listen = .*|listen = ["systemd:domain=INET:name=http"]|' "$here/prexy.toml" > "$etc/prexy.toml.new"
    if ! grep -q '^listen = \["systemd:domain=INET:name=http"\]$' "$etc/prexy.toml.new"; then
        rm -f "$etc/prexy.toml.new"
        echo "install.sh: no 'listen = ...' line in $here/prexy.toml to point at the systemd socket" >&2
        exit 1
    fi
    chmod 644 "$etc/prexy.toml.new"
    mv "$etc/prexy.toml.new" "$etc/prexy.toml"
else
    echo "install.sh: keeping $etc/prexy.toml" >&2
fi
for f in "$here"/sites.d/*.toml; do
    keep "$f" "$etc/sites.d/$(basename "$f")"
done
for f in "$here"/*.rules "$here"/*.map; do
    keep "$f" "$etc/$(basename "$f")"
done

install -d -m 755 "$root/usr/local/share/doc/prexy"
install -m 644 "$here/../README.md" "$root/usr/local/share/doc/prexy/README.md"
install -d -m 755 "$root/usr/local/share/doc/prexy/docs"
install -m 644 "$here"/../docs/*.md "$root/usr/local/share/doc/prexy/docs/"

echo "install.sh: installed; check with: /opt/prexy/bin/twistd prexy --config /etc/prexy/prexy.toml --check"
