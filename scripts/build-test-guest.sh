#!/usr/bin/env bash
# Builds the tiny guest of the QEMU end-to-end test from Debian packages:
# OUT/vmlinuz (Debian's kernel) and OUT/initrd.img (busybox, the virtio
# modules, and qemu-ga with its libraries). Its init loads the virtio
# console and network drivers, starts the QEMU guest agent on the
# virtio-serial port and waits; /etc is a tmpfs, so whatever the host agent
# writes there is gone after a reboot.
set -euo pipefail
out=${1:?usage: build-test-guest.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
# Bump when the guest changes, so a cached guest is rebuilt.
version=2
[ -s "$out/vmlinuz" ] && [ -s "$out/initrd.img" ] && [ "$(cat "$out/version" 2>/dev/null)" = "$version" ] && exit 0
modules="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_console failover net_failover virtio_net"

for tool in busybox cpio dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "build-test-guest: $tool is missing (busybox-static, cpio)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
apt-get download -qq "$kernel_pkg" qemu-guest-agent
mkdir x
for deb in *.deb; do dpkg-deb -x "$deb" x; done
kver=$(ls x/lib/modules)
cp x/boot/vmlinuz-"$kver" "$out/vmlinuz"

root=$work/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,run,tmp,usr/bin,lib/modules,lib64,lib/x86_64-linux-gnu}
cp "$(command -v busybox)" "$root/bin/busybox"
cp x/usr/sbin/qemu-ga "$root/usr/bin/qemu-ga"
ldd x/usr/sbin/qemu-ga | awk '/=> \// {print $3} /^\s*\/lib64/ {print $1}' | while read -r lib; do
  cp -L "$lib" "$root$lib"
done
for m in $modules; do
  f=$(find x/lib/modules -name "$m.ko" | head -n 1)
  [ -n "$f" ] && cp "$f" "$root/lib/modules/"
done
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
cat > "$root/init" <<'SH'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs etc /etc
for m in MODULES; do
  [ -f /lib/modules/$m.ko ] && insmod /lib/modules/$m.ko
done
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
while true; do sleep 3600; done
SH
sed -i "s/MODULES/$modules/" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$out/initrd.img")
echo "$version" > "$out/version"
echo "build-test-guest: $out/vmlinuz $out/initrd.img"
