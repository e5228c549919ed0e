#!/usr/bin/env bash
# Builds Kumo's Debian packages from binaries already built:
#
#   ops/debian/build-debs.sh BIN_DIR OUT_DIR
#
# kumo-server (control plane, systemd unit, /etc/kumo/server.toml, its
# user), kumo-agent (host agent, unit, /etc/kumo/agent.env, libvirt, QEMU
# and the network tools it drives) and kumo (the CLI, with bash completion).
# `cargo xtask deb` builds release binaries and calls this; the packaging
# test calls it on the test build's binaries. Needs dpkg-dev (for
# dpkg-shlibdeps, which turns the binaries' libraries into dependencies).
set -euo pipefail
bin=$(cd "${1:?usage: $0 BIN_DIR OUT_DIR}" && pwd)
mkdir -p "${2:?usage: $0 BIN_DIR OUT_DIR}"
out=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
version=$("$bin/kumo-server" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The libraries a binary links, as package dependencies (dpkg-shlibdeps
# wants a debian/control beside it).
shlibs() {
  mkdir -p "$work/shlibs/debian"
  printf 'Source: kumo\n\nPackage: kumo\nArchitecture: any\n' >"$work/shlibs/debian/control"
  (cd "$work/shlibs" && dpkg-shlibdeps -O "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

# stage PACKAGE: an empty tree for it, with its control directory.
stage() {
  local d=$work/$1
  install -d -m 0755 "$d/DEBIAN" "$d/usr/bin" "$d/usr/share/doc/$1"
  install -m 0644 "$root/README.md" "$d/usr/share/doc/$1/README.md"
  printf 'Kumo, a multi-tenant GPU cloud control plane.\nLicense: see the source repository.\n' \
    >"$d/usr/share/doc/$1/copyright"
  chmod 0644 "$d/usr/share/doc/$1/copyright"
}

# control PACKAGE DEPENDS DESCRIPTION...
control() {
  local pkg=$1 depends=$2
  shift 2
  local size
  size=$(du -sk --exclude=DEBIAN "$work/$pkg" | cut -f1)
  {
    echo "Package: $pkg"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: Kumo maintainers <kumo@example.org>"
    echo "Section: admin"
    echo "Priority: optional"
    echo "Installed-Size: $size"
    echo "Depends: $depends"
    echo "Description: $1"
    shift
    for line in "$@"; do echo " $line"; done
  } >"$work/$pkg/DEBIAN/control"
  (cd "$work/$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\n' | sort | xargs md5sum) \
    >"$work/$pkg/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -Zxz --build "$work/$pkg" "$out/${pkg}_${version}_${arch}.deb" >/dev/null
  echo "$out/${pkg}_${version}_${arch}.deb"
}

# kumo-server
d=$work/kumo-server
stage kumo-server
install -m 0755 "$bin/kumo-server" "$d/usr/bin/kumo-server"
install -d -m 0755 "$d/lib/systemd/system" "$d/usr/lib/sysusers.d" "$d/etc/kumo"
install -m 0644 "$here/kumo-server.service" "$d/lib/systemd/system/kumo-server.service"
install -m 0644 "$here/kumo.sysusers" "$d/usr/lib/sysusers.d/kumo.conf"
install -m 0640 "$here/server.toml" "$d/etc/kumo/server.toml"
install -m 0755 "$here/kumo-server.postinst" "$d/DEBIAN/postinst"
install -m 0755 "$here/kumo-server.prerm" "$d/DEBIAN/prerm"
install -m 0755 "$here/kumo-server.postrm" "$d/DEBIAN/postrm"
echo /etc/kumo/server.toml >"$d/DEBIAN/conffiles"
control kumo-server "$(shlibs -e"$bin/kumo-server"), passwd, adduser | passwd" \
  "Kumo control plane: API, web portal and background jobs" \
  "The server of Kumo, a multi-tenant GPU cloud: tenants, quotas, points," \
  "topology-aware placement of GPU VMs, tenant networks, and the portal." \
  "Runs as the kumo user (kumo-server.service) on SQLite in /var/lib/kumo" \
  "or on PostgreSQL; configured in /etc/kumo/server.toml."

# kumo-agent: the tools it runs are its dependencies.
d=$work/kumo-agent
stage kumo-agent
install -m 0755 "$bin/kumo-agent" "$d/usr/bin/kumo-agent"
install -d -m 0755 "$d/lib/systemd/system" "$d/etc/kumo"
install -m 0644 "$here/kumo-agent.service" "$d/lib/systemd/system/kumo-agent.service"
install -m 0600 "$here/agent.env" "$d/etc/kumo/agent.env"
install -m 0755 "$here/kumo-agent.postinst" "$d/DEBIAN/postinst"
install -m 0755 "$here/kumo-agent.prerm" "$d/DEBIAN/prerm"
echo /etc/kumo/agent.env >"$d/DEBIAN/conffiles"
control kumo-agent "$(shlibs -e"$bin/kumo-agent"), libvirt-daemon-system, libvirt-daemon-driver-qemu, qemu-system-x86, qemu-utils, ovmf, iproute2, nftables, dnsmasq-base, genisoimage" \
  "Kumo host agent: VMs on libvirt, tenant networks, passed-through devices" \
  "Registers a GPU host with the Kumo control plane and reconciles its VMs" \
  "(libvirt/KVM with GPUs and RDMA NICs passed through), tenant VXLAN" \
  "segments (netlink, nftables), volumes and device health." \
  "Configured in /etc/kumo/agent.env; kumo-agent.service runs it."

# kumo (the CLI)
d=$work/kumo
stage kumo
install -m 0755 "$bin/kumo" "$d/usr/bin/kumo"
install -d -m 0755 "$d/usr/share/bash-completion/completions"
"$bin/kumo" completions bash >"$d/usr/share/bash-completion/completions/kumo"
chmod 0644 "$d/usr/share/bash-completion/completions/kumo"
control kumo "$(shlibs -e"$bin/kumo")" \
  "Kumo command-line client" \
  "kumo: VMs, clusters, segments, volumes, public addresses, points and" \
  "the rest of a Kumo GPU cloud from the terminal (REST API, SSO sign-in)."
