#!/usr/bin/env bash
# Makes libvirtd (qemu:///system) and virtlogd run for the end-to-end test,
# on machines without systemd.
#
# The test runs guests under TCG. Where /dev/kvm exists but nested KVM
# hangs (as on the CI machines), libvirt would probe QEMU with KVM, find it
# unusable, and probe again on every call (tens of seconds each). So
# libvirtd runs in a mount namespace of its own where /dev/kvm is a root-only
# file: libvirt sees no usable KVM and caches TCG capabilities once. Per-VM
# namespaces are off because they would try to recreate that fake node.
# Set KUMO_TEST_USE_KVM=1 to leave /dev/kvm alone.
set -euo pipefail
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

conf=/etc/libvirt/qemu.conf
if [ -f "$conf" ] && ! grep -q '^namespaces = \[\]' "$conf"; then
  echo 'namespaces = []' | as_root tee -a "$conf" >/dev/null
fi
pgrep -x virtlogd >/dev/null || as_root virtlogd -d

answers() { virsh -c qemu:///system version >/dev/null 2>&1; }
start() {
  if [ -e /dev/kvm ] && [ -z "${KUMO_TEST_USE_KVM:-}" ]; then
    as_root install -m 600 /dev/null /var/tmp/kumo-no-kvm
    # A slave of the host's mounts: what the agent mounts later (a share's
    # read-only bind, the source virtiofsd is given) reaches libvirtd, and
    # the /dev/kvm bind stays in here.
    as_root mount --make-rshared /
    as_root unshare --mount --propagation slave sh -c 'mount --bind /var/tmp/kumo-no-kvm /dev/kvm && exec libvirtd -d'
  else
    as_root libvirtd -d
  fi
}
# A daemon that is still shutting down holds the pid file: try twice.
for attempt in 1 2; do
  answers && exit 0
  pgrep -x libvirtd >/dev/null || start || true
  for _ in $(seq 1 100); do
    answers && exit 0
    sleep 0.2
  done
done
echo "ensure-libvirtd: libvirtd does not answer on qemu:///system" >&2
exit 1
