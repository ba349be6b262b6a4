#!/usr/bin/env bash
# Builds the Debian package fqdnd_VERSION_ARCH.deb into target/debian (or $OUT) and prints its
# path: the release binary, the CNI plugin link, the systemd units, the example
# configuration (conffiles in /etc/fqdnd), man pages and bash/zsh/fish completions generated
# from the CLI (`fqdnd generate`), the maintainer scripts (packaging/debian).
#
# A plain dpkg-deb script rather than cargo-deb: nothing more to install (dpkg-deb is on
# every Debian), hand-written maintainer scripts either way (three units with conditions,
# state kept on remove and removed on purge, BPF unloaded on removal), and the generated
# man pages and completions need the built binary, which cargo-deb's asset list cannot run.
#
# VERSION is the workspace's version + `+git<commits>.<commit>`: every commit sorts after
# the ones before it, so a package of a later commit upgrades one of an earlier commit.
#
# Environment: FQDND_DEB_BINARY (package this binary instead of building one: the upgrade
# test packages an older commit's), FQDND_DEB_VERSION (its version), FQDND_DEB_GENERATOR (the
# binary that writes the man pages and completions, when FQDND_DEB_BINARY has no `generate`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/target/debian}
bin=${FQDND_DEB_BINARY:-}
if [ -z "$bin" ]; then
  nice -n 10 cargo build --release --locked --bin fqdnd >&2
  bin=${CARGO_TARGET_DIR:-$root/target}/release/fqdnd
fi
generator=${FQDND_DEB_GENERATOR:-$bin}
base=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
if [ -n "${FQDND_DEB_VERSION:-}" ]; then
  version=$FQDND_DEB_VERSION
elif git rev-parse HEAD >/dev/null 2>&1; then
  version="$base+git$(git rev-list --count HEAD).$(git rev-parse --short=12 HEAD)"
else
  version=$base
fi
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/fqdnd
mkdir -p "$pkg/DEBIAN" "$out"

# The binary, stripped (Debian ships debug symbols apart), and the CNI plugin: the binary
# acts as the plugin when called fqdnd-cni, where containernetworking-plugins puts plugins.
install -D -m 0755 "$bin" "$pkg/usr/bin/fqdnd"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$pkg/usr/bin/fqdnd"
mkdir -p "$pkg/usr/lib/cni"
ln -s ../../bin/fqdnd "$pkg/usr/lib/cni/fqdnd-cni"

# Units (bookworm's dpkg still ships them under /lib, merged-/usr or not).
install -D -m 0644 -t "$pkg/lib/systemd/system" packaging/systemd/*.service

# Configuration: conffiles.
install -D -m 0644 packaging/etc/gateway.yaml "$pkg/etc/fqdnd/gateway.yaml"
install -D -m 0644 packaging/etc/node.yaml.example "$pkg/etc/fqdnd/node.yaml.example"
install -D -m 0644 packaging/etc/cluster.yaml.example "$pkg/etc/fqdnd/cluster.yaml.example"
(cd "$pkg" && find etc -type f | sort | sed 's,^,/,') > "$pkg/DEBIAN/conffiles"

# Man pages and completions from the CLI definition.
"$generator" generate man "$stage/man"
install -d "$pkg/usr/share/man/man1"
for page in "$stage"/man/*.1; do
  gzip -9n < "$page" > "$pkg/usr/share/man/man1/$(basename "$page").gz"
done
"$generator" generate completions "$stage/completions"
install -D -m 0644 "$stage/completions/fqdnd.bash" "$pkg/usr/share/bash-completion/completions/fqdnd"
install -D -m 0644 "$stage/completions/_fqdnd" "$pkg/usr/share/zsh/vendor-completions/_fqdnd"
install -D -m 0644 "$stage/completions/fqdnd.fish" "$pkg/usr/share/fish/vendor_completions.d/fqdnd.fish"

# Documentation.
doc=$pkg/usr/share/doc/fqdnd
install -D -m 0644 packaging/debian/copyright "$doc/copyright"
install -m 0644 README.md docs/manual/install-and-upgrade.md "$doc/"
install -D -m 0644 examples/gateway-demo.yaml "$doc/examples/gateway-demo.yaml"
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
commit=$(git rev-parse HEAD 2>/dev/null || echo "an unknown commit")
printf 'fqdnd (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- %s  %s\n' \
  "$version" "$commit" "$(sed -n 's/^Maintainer: //p' packaging/debian/control.in)" "$date" \
  | gzip -9n > "$doc/changelog.gz"
install -D -m 0644 packaging/debian/lintian-overrides "$pkg/usr/share/lintian/overrides/fqdnd"

# Maintainer scripts and control.
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$pkg/DEBIAN/"
# libc: the newest GLIBC_ symbol version the binary needs.
glibc=$(objdump -T "$pkg/usr/bin/fqdnd" | sed -n 's/.*GLIBC_\([0-9.]*\).*/\1/p' | sort -uV | tail -1)
size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SIZE@/$size/" \
  -e "s/@DEPENDS@/libc6 (>= $glibc), libgcc-s1/" packaging/debian/control.in > "$pkg/DEBIAN/control"
(cd "$pkg" && find . \( -path ./DEBIAN -o -path ./etc \) -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$pkg/DEBIAN/md5sums"

deb=$out/fqdnd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >&2
echo "$deb"
