#!/usr/bin/env bash
# Build the host package of cri-resmgr for Debian 12 (relay mode as a systemd service):
#
#   scripts/build-deb.sh [OUTDIR]     writes OUTDIR/cri-resmgr_<version>_amd64.deb (default: dist/)
#
# The package carries its own Python environment, /opt/cri-resmgr/venv, made with Debian's
# python3.11 (the system Python refuses `pip install`: it is EXTERNALLY-MANAGED), holding the project
# and its dependencies from PyPI; /usr/bin/cri-resmgr and cri-resmgr-agent; the relay's unit (enabled),
# the NRI plugin's and the agent's (not enabled); /etc/cri-resmgr/fallback.yaml, /etc/default/cri-resmgr
# and /etc/default/cri-resmgr-agent as conffiles; and a kubelet
# configuration drop-in its maintainer scripts put in place and take away (packaging/deb/).
# Needs Debian's python3.11 and python3-venv, and dpkg-deb (scripts/setup.sh vm installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
# The project's version in Debian's terms: a development version sorts before its release (0.3.0~dev0).
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])' \
    | sed 's/\.dev/~dev/')
[ -x /usr/bin/python3.11 ] || { echo "build-deb: Debian's python3.11 is needed (apt-get install python3-venv)" >&2; exit 1; }

work=$(mktemp -d /tmp/crirm-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root/DEBIAN" "$root/opt/cri-resmgr" "$root/usr/bin" "$root/lib/systemd/system" \
    "$root/etc/cri-resmgr" "$root/etc/default" "$root/usr/share/cri-resmgr" "$root/usr/share/doc/cri-resmgr" "$out"

# The environment is made where it will live (/opt/cri-resmgr), so its scripts' paths are right: in a
# private mount namespace that shows the package's tree there, leaving the host's /opt untouched.
# setuptools builds in the tree (build/, *.egg-info): one wheel build of a tree at a time (the image
# builder takes the same lock).
flock . .venv/bin/python -m pip wheel -q --no-deps -w "$work/wheel" .
mkdir -p /opt/cri-resmgr
unshare --mount --propagation private sh -euc '
    mount --bind "$1/opt/cri-resmgr" /opt/cri-resmgr
    /usr/bin/python3.11 -m venv /opt/cri-resmgr/venv
    /opt/cri-resmgr/venv/bin/pip install -q --disable-pip-version-check --no-compile "$2"/*.whl
    # pip and setuptools only build and install: 900 files fewer for dpkg to unpack on every upgrade.
    /opt/cri-resmgr/venv/bin/pip uninstall -q -y pip setuptools
    find /opt/cri-resmgr -name __pycache__ -prune -exec rm -rf {} +
    # Bytecode ships with the package (hash-checked: valid whatever the files mtimes), so the first
    # start after an install does not compile every module (seconds on a small node) and nothing
    # the package does not own is left behind in /opt on removal.
    /usr/bin/python3.11 -m compileall -q -j 0 --invalidation-mode checked-hash /opt/cri-resmgr/venv/lib
' sh "$root" "$work/wheel"
rmdir /opt/cri-resmgr 2>/dev/null || true
ln -s /opt/cri-resmgr/venv/bin/cri-resmgr "$root/usr/bin/cri-resmgr"
ln -s /opt/cri-resmgr/venv/bin/cri-resmgr-agent "$root/usr/bin/cri-resmgr-agent"

for unit in cri-resmgr cri-resmgr-nri cri-resmgr-agent; do
    sed 's|/usr/local/bin/|/usr/bin/|' "config/$unit.service" >"$root/lib/systemd/system/$unit.service"
done
cp config/cri-resmgr.sample.yaml "$root/etc/cri-resmgr/fallback.yaml"
cp packaging/deb/default "$root/etc/default/cri-resmgr"
cp packaging/deb/default-agent "$root/etc/default/cri-resmgr-agent"
cp packaging/deb/kubelet-dropin.conf "$root/usr/share/cri-resmgr/"
cp README.md "$root/usr/share/doc/cri-resmgr/"
cp packaging/deb/conffiles "$root/DEBIAN/"
install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed "s/@VERSION@/$version/" packaging/deb/control >"$root/DEBIAN/control"
echo "Installed-Size: $size" >>"$root/DEBIAN/control"
dpkg-deb --root-owner-group -Zzstd --build "$root" "$out/cri-resmgr_${version}_amd64.deb" >/dev/null
echo "$out/cri-resmgr_${version}_amd64.deb"
