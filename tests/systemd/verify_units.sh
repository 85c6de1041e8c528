#!/usr/bin/env bash
# systemd-analyze verify on the units in systemd/: every directive known to
# this systemd, the socket and service consistent. The units name
# /usr/bin/trainerd, where the package installs it; verify checks that
# ExecStart= is executable, so the copies here point at $1 (the trainerd
# binary of the build, or any executable until the daemon binary exists).
set -euo pipefail
src=$(cd "$(dirname "$0")/../../systemd" && pwd)
binary=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in trainerd.service trainerd.socket; do
  sed "s|/usr/bin/trainerd|$binary|g" "$src/$unit" > "$tmp/$unit"
done
# verify prints problems and exits non-zero on errors; warnings also fail here.
out=$(systemd-analyze verify --man=no "$tmp/trainerd.socket" "$tmp/trainerd.service" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "$out"; exit 1; fi
# sysusers.d and tmpfiles.d entries, applied to an empty root: the user and
# group appear, then the folders with their owner and mode.
root=$tmp/root
mkdir -p "$root/etc"
touch "$root/etc/passwd" "$root/etc/group" "$root/etc/shadow" "$root/etc/gshadow"
if [ "$(id -u)" != 0 ]; then
  # Writing a root's passwd files needs root; without it, check the entries only.
  systemd-sysusers --dry-run --root="$root" "$src/trainerd.sysusers.conf" >/dev/null 2>&1 ||
    { systemd-sysusers --dry-run --root="$root" "$src/trainerd.sysusers.conf"; exit 1; }
  echo "not root: sysusers.d checked with --dry-run, tmpfiles.d entries not applied (chown needs root)"
  echo "systemd units verified"
  exit 0
fi
systemd-sysusers --root="$root" "$src/trainerd.sysusers.conf" >/dev/null 2>&1
grep -q '^trainerd:' "$root/etc/passwd" || { echo "sysusers.d entry made no trainerd user"; exit 1; }
out=$(systemd-tmpfiles --create --root="$root" "$src/trainerd.tmpfiles.conf" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then echo "$out"; exit 1; fi
uid=$(awk -F: '$1 == "trainerd" {print $3}' "$root/etc/passwd")
for d in var/lib/trainerd var/lib/trainerd/cache run/trainerd; do
  got=$(stat -c '%a %u' "$root/$d" 2>/dev/null || echo missing)
  [ "$got" = "750 $uid" ] || { echo "tmpfiles.d: /$d is '$got', want '750 $uid'"; exit 1; }
done
echo "systemd units, sysusers.d and tmpfiles.d verified"
