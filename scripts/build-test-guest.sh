#!/usr/bin/env bash
# Builds the tiny guest of the QEMU end-to-end test from Debian packages:
# OUT/vmlinuz (Debian's kernel) and OUT/initrd.img (busybox, the virtio
# (console, network, block), virtiofs,
# SATA cdrom and ISO 9660 modules, and qemu-ga with its libraries). Its init
# loads the drivers, starts the QEMU guest agent on the virtio-serial port
# and, beside it, configures the network from the cloud-init NoCloud seed
# (the cdrom labelled cidata) as cloud-init would: the hostname from
# meta-data, the first NIC's address, MTU and default route from
# network-config. It also mounts the project shares (virtiofs) listed under
# `mounts:` in the seed's user-data, as cloud-init's mounts module would,
# and records the outcome in /run/kumo-mounts. It answers TCP on port 8080
# with its hostname. /etc is a tmpfs, so whatever the host agent writes
# there is gone after a reboot.
#
# SSH for real: Dropbear (Debian's dropbear-bin, with its libraries) on
# port 22, public keys only, for root, whose authorized_keys are the
# seed's `ssh_authorized_keys` (as cloud-init writes them for the default
# user; the test template's default user is root). Its host key is made at
# boot (ed25519: quick even under TCG); /run/kumo-ssh says when it listens.
#
# GPU telemetry without a GPU: /usr/bin/nvidia-smi is a stand-in that
# prints /run/kumo-fake-gpus.csv (which a test writes through the guest
# agent, one row per GPU in the order of kumo_topology::gpu_telemetry::
# QUERY_FIELDS) and fails like the real tool without a driver when there is
# none. Fake Xids go where the driver's go, the kernel log: a test runs
# `sh -c 'echo "NVRM: Xid (PCI:0000:11:00): 79, GPU has fallen off the bus." > /dev/kmsg'`
# through guest-exec, and busybox `dmesg` shows the line as dmesg shows
# the driver's.
#
# RoCE without a ConnectX VF: `kumo-soft-roce NETDEV` loads the kernel's
# software RoCE (rdma_rxe, a stand-in for a VF's mlx5 device) and adds an
# RDMA device `rxe0` over NETDEV with iproute2's `rdma`. The kernel then
# keeps its GID table (RoCE v1 and v2 entries for each address of NETDEV)
# in sysfs exactly as it does for a VF, which is what the host agent reads.
set -euo pipefail
out=${1:?usage: build-test-guest.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Bump when the guest changes, so a cached guest is rebuilt.
version=11
[ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] && [ "$(cat "$out/version" 2>/dev/null)" = "$version" ] && exit 0
# In dependency order (the package has no modules.dep; see each module's
# `depends=` in its .modinfo). The seed is a SATA cdrom on q35's AHCI.
# virtiofs (the project shares) depends on fuse, virtio and virtio_ring.
modules="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk virtio_console failover net_failover virtio_net
 fuse virtiofs scsi_common scsi_mod libata libahci ahci cdrom sr_mod isofs"

for tool in busybox cpio dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "build-test-guest: $tool is missing (busybox-static, cpio)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
apt-get download -qq "$kernel_pkg" qemu-guest-agent dropbear-bin libtomcrypt1 libtommath1
mkdir x
for deb in *.deb; do dpkg-deb -x "$deb" x; done
kver=$(ls x/lib/modules)
cp x/boot/vmlinuz-"$kver" "$out/vmlinuz"

root=$work/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,run,tmp,root,usr/bin,usr/sbin,lib/modules,lib64,lib/x86_64-linux-gnu}
cp "$(command -v busybox)" "$root/bin/busybox"
cp x/usr/sbin/qemu-ga "$root/usr/bin/qemu-ga"
ldd x/usr/sbin/qemu-ga | awk '/=> \// {print $3} /^\s*\/lib64/ {print $1}' | while read -r lib; do
  cp -L "$lib" "$root$lib"
done
# Dropbear's libraries: those of its own packages (not installed here)
# from the extracted tree, the rest (libc, libcrypt, zlib) the host's.
cp x/usr/sbin/dropbear x/usr/bin/dropbearkey "$root/usr/sbin/"
LD_LIBRARY_PATH=$work/x/usr/lib/x86_64-linux-gnu ldd x/usr/sbin/dropbear x/usr/bin/dropbearkey |
  awk '/=> \// {print $3} /^\s*\/lib64/ {print $1}' | sort -u | while read -r lib; do
  case "$lib" in
    "$work"/*) cp -L "$lib" "$root/lib/x86_64-linux-gnu/" ;;
    *) cp -L "$lib" "$root$lib" ;;
  esac
done
for m in $modules; do
  f=$(find x/lib/modules -name "$m.ko" | head -n 1)
  [ -n "$f" ] && cp "$f" "$root/lib/modules/"
done
# Loaded on demand (kumo-soft-roce), not at boot.
roce_modules="crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe"
for m in $roce_modules; do
  f=$(find x/lib/modules -name "$m.ko" | head -n 1)
  [ -n "$f" ] || { echo "build-test-guest: $m.ko is not in $kernel_pkg" >&2; exit 1; }
  cp "$f" "$root/lib/modules/"
done
command -v rdma >/dev/null || { echo "build-test-guest: rdma is missing (iproute2)" >&2; exit 1; }
cp "$(command -v rdma)" "$root/usr/bin/rdma"
ldd "$(command -v rdma)" | awk '/=> \// {print $3} /^\s*\/lib64/ {print $1}' | while read -r lib; do
  cp -L "$lib" "$root$lib"
done
cat > "$root/bin/kumo-soft-roce" <<SH
#!/bin/sh
for m in $roce_modules; do
  [ -d /sys/module/\$m ] || insmod /lib/modules/\$m.ko || exit 1
done
rdma link add rxe0 type rxe netdev "\${1:?usage: kumo-soft-roce NETDEV}"
SH
chmod +x "$root/bin/kumo-soft-roce"
# qemu-ga's guest-shutdown runs /sbin/shutdown; busybox has reboot/poweroff.
# Like a real distribution's, it schedules the action and returns, so that
# qemu-ga can answer before the guest goes down.
cat > "$root/sbin/shutdown" <<'SH'
#!/bin/sh
case "$*" in *-r*) action=reboot ;; *) action=poweroff ;; esac
(sleep 0.3; /bin/$action -f) >/dev/null 2>&1 &
exit 0
SH
chmod +x "$root/sbin/shutdown"
# The network, from the NoCloud seed. Bounded waits: without a seed (or a
# NIC) it says so and gives up; the guest agent does not wait for it.
cat > "$root/bin/kumo-net" <<'SH'
#!/bin/sh
say() { echo "kumo test guest: $*"; }
i=0
while [ ! -b /dev/sr0 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
mkdir -p /seed
if ! mount -t iso9660 -o ro /dev/sr0 /seed 2>/dev/null; then
  say "no seed (no cidata cdrom)"
  exit 0
fi
name=$(sed -n 's/^local-hostname: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' /seed/meta-data 2>/dev/null)
[ -n "$name" ] && hostname "$name"
[ -f /seed/network-config ] || { say "no network-config in the seed"; exit 0; }
# The first NIC of the netplan v2 document (`  nicN:` at two spaces), its
# own keys at four spaces (the nameservers' addresses are at six).
set -- $(awk '
  /^  [^ ]/ { n++ }
  n == 1 && /^      macaddress:/ { mac = $2 }
  n == 1 && /^    addresses:/ { addr = $2 }
  n == 1 && /^    mtu:/ { mtu = $2 }
  n == 1 && /^    gateway4:/ { gw = $2 }
  END {
    s = (mac == "" ? "-" : mac) " " (addr == "" ? "-" : addr) " " (mtu == "" ? "-" : mtu) " " (gw == "" ? "-" : gw)
    gsub(/[]",[]/, "", s)
    print tolower(s)
  }' /seed/network-config)
mac=$1 addr=$2 mtu=$3 gw=$4
dev=""
i=0
while [ -z "$dev" ] && [ $i -lt 100 ]; do
  for d in /sys/class/net/*; do
    [ "$(cat "$d/address" 2>/dev/null)" = "$mac" ] && dev=${d##*/}
  done
  [ -n "$dev" ] || sleep 0.1
  i=$((i + 1))
done
if [ -z "$dev" ] || [ "$addr" = - ]; then
  say "no NIC with MAC $mac (address $addr)"
  exit 0
fi
[ "$mtu" != - ] && ip link set dev "$dev" mtu "$mtu"
ip addr add "$addr" dev "$dev"
ip link set dev "$dev" up
[ "$gw" != - ] && ip route add default via "$gw" dev "$dev"
# Also for the host to read (through the guest agent): what, and when.
up=$(cut -d " " -f 1 /proc/uptime)
say "$dev $addr via $gw (mtu $mtu), ${up}s after boot" | tee /run/kumo-net
SH
chmod +x "$root/bin/kumo-net"
# The project shares, from the seed's user-data, which the host agent
# writes in cloud-init's `mounts` form, one entry per share:
#   mounts:
#     - ["TAG", "/PATH", "virtiofs", "defaults,nofail,ro", "0", "0"]
# Its own script, not part of kumo-net: that one stops early when the seed
# has no network-config. It mounts the seed itself (a second read-only
# mount of the same cdrom) rather than racing kumo-net for /seed.
# `defaults` and `nofail` are fstab words (busybox mount takes them, to no
# effect) and are dropped: a failure is recorded, never fatal. One line
# per entry goes to
# /run/kumo-mounts (`TAG PATH mounted` or `TAG PATH failed: ERROR`), for
# the host to read through the guest agent; the file appears, complete,
# once every entry was tried (empty when there are none).
cat > "$root/bin/kumo-mounts" <<'SH'
#!/bin/sh
say() { echo "kumo test guest: $*"; }
i=0
while [ ! -b /dev/sr0 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
seed=/run/kumo-mounts-seed
mkdir -p "$seed"
if ! mount -t iso9660 -o ro /dev/sr0 "$seed" 2>/dev/null; then
  say "no seed (no cidata cdrom): no shares"
  exit 0
fi
# The quoted fields of each `- [...]` line under the top-level `mounts:`
# key: tag, mount point, type, options (dump and pass do not matter).
awk -F '"' '
  /^[^ #-]/ { in_mounts = ($0 ~ /^mounts:/) }
  in_mounts && /^ *- *\[/ { print $2, $4, $6, $8 }
' "$seed/user-data" 2>/dev/null > /run/kumo-mounts.list
umount "$seed"
: > /run/kumo-mounts.tmp
while read -r tag path type opts; do
  o=""
  for w in $(echo "$opts" | tr , " "); do
    case "$w" in defaults|nofail) ;; *) o="$o${o:+,}$w" ;; esac
  done
  mkdir -p "$path"
  if err=$(mount -t "$type" ${o:+-o "$o"} "$tag" "$path" 2>&1); then
    echo "$tag $path mounted" >> /run/kumo-mounts.tmp
  else
    # On one line: $err unquoted, its newlines become spaces.
    echo "$tag $path failed: "$err >> /run/kumo-mounts.tmp
  fi
done < /run/kumo-mounts.list
rm -f /run/kumo-mounts.list
mv /run/kumo-mounts.tmp /run/kumo-mounts
say "shares: $(wc -l < /run/kumo-mounts) entries, see /run/kumo-mounts"
SH
chmod +x "$root/bin/kumo-mounts"
# SSH: root's authorized keys from the seed's user-data, which the host
# agent writes as cloud-init's list, each key a YAML double-quoted string:
#   ssh_authorized_keys:
#     - "ssh-ed25519 AAAA… user@laptop"
# then Dropbear with a host key made now, public keys only.
cat > "$root/bin/kumo-ssh" <<'SH'
#!/bin/sh
say() { echo "kumo test guest: $*"; }
i=0
while [ ! -b /dev/sr0 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done
seed=/run/kumo-ssh-seed
mkdir -p "$seed" /root/.ssh /etc/dropbear
chmod 700 /root /root/.ssh
: > /root/.ssh/authorized_keys
if mount -t iso9660 -o ro /dev/sr0 "$seed" 2>/dev/null; then
  awk '
    /^[^ ]/ { on = ($0 ~ /^ssh_authorized_keys:/); next }
    on && /^ *- / {
      sub(/^ *- */, ""); sub(/^"/, ""); sub(/"$/, "")
      gsub(/\\"/, "\""); gsub(/\\\\/, "\\"); print
    }' "$seed/user-data" > /root/.ssh/authorized_keys
  umount "$seed"
fi
chmod 600 /root/.ssh/authorized_keys
dropbearkey -t ed25519 -f /etc/dropbear/dropbear_ed25519_host_key >/dev/null 2>&1
if dropbear -r /etc/dropbear/dropbear_ed25519_host_key -s -p 22 2>/run/kumo-ssh.err; then
  up=$(cut -d " " -f 1 /proc/uptime)
  say "ssh on port 22 for root, $(grep -c . /root/.ssh/authorized_keys) key(s), ${up}s after boot" | tee /run/kumo-ssh
else
  say "dropbear failed: $(cat /run/kumo-ssh.err)" | tee /run/kumo-ssh
fi
SH
chmod +x "$root/bin/kumo-ssh"
# What the guest answers on TCP port 8080: its name.
cat > "$root/bin/kumo-hello" <<'SH'
#!/bin/sh
hostname
SH
chmod +x "$root/bin/kumo-hello"
# nvidia-smi's stand-in. It answers only the query the host agent makes
# (--query-gpu=…, whatever the fields: the test's file has the rows), with
# the real tool's exit codes: 2 for arguments it does not take, 9 when "the
# NVIDIA driver is not loaded", which is what a GPU VM whose driver died
# looks like.
cat > "$root/usr/bin/nvidia-smi" <<'SH'
#!/bin/sh
query=""
for a in "$@"; do
  case "$a" in --query-gpu=?*) query=1 ;; esac
done
if [ -z "$query" ]; then
  echo "nvidia-smi (kumo test guest): only --query-gpu=... is faked, not: $*" >&2
  exit 2
fi
if [ -f /run/kumo-fake-gpus.csv ]; then
  cat /run/kumo-fake-gpus.csv
  exit 0
fi
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running." >&2
exit 9
SH
chmod +x "$root/usr/bin/nvidia-smi"
cat > "$root/init" <<'SH'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs etc /etc
# Who may log in (SSH): root, with a shell; no password (keys only).
echo 'root:x:0:0:root:/root:/bin/sh' > /etc/passwd
echo 'root:x:0:' > /etc/group
echo /bin/sh > /etc/shells
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
# Lines a test writes to /dev/kmsg (fake Xids) are rate limited to 10 in 5
# seconds by default; a burst of them must all reach dmesg.
{ echo on > /proc/sys/kernel/printk_devkmsg; } 2>/dev/null
for m in MODULES; do
  [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
done
ip link set lo up
kumo-net &
kumo-mounts &
kumo-ssh &
nc -ll -p 8080 -e /bin/kumo-hello &
port=""
for i in $(seq 1 50); do
  for p in /sys/class/virtio-ports/*; do
    [ -f "$p/name" ] && [ "$(cat $p/name)" = org.qemu.guest_agent.0 ] && port=/dev/${p##*/}
  done
  [ -n "$port" ] && break
  sleep 0.1
done
echo "kumo test guest: guest agent port ${port:-missing}"
mkdir -p /var/run
qemu-ga -m virtio-serial -p "$port" -t /run &
# A shell on the serial console (ttyS0), as its controlling terminal.
(while true; do setsid cttyhack /bin/sh; done) &
while true; do sleep 3600; done
SH
sed -i "s/MODULES/$(echo $modules)/" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/initrd.img")
echo "$version" > "$out/version"
echo "build-test-guest: $out/vmlinuz $out/initrd.img"
