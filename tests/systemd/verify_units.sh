#!/usr/bin/env bash
# systemd-analyze verify on the units in systemd/: every directive known to
# this systemd, the socket and service consistent, ExecStart= executable. The
# units name /usr/bin/trainerd, where the package installs it; the copies
# verified here differ from the shipped units only in that path, which points
# at $1, the trainerd binary of the build.
#
#   verify_units.sh BUILD/bin/trainerd
set -euo pipefail
src=$(cd "$(dirname "$0")/../../systemd" && pwd)
if [ $# -ne 1 ]; then echo "usage: $0 PATH/TO/trainerd" >&2; exit 2; fi
binary=$1
case $binary in
  /*) ;;
  *) echo "$binary: give the trainerd binary's absolute path (ExecStart= needs one)"; exit 1 ;;
esac
[ -x "$binary" ] || { echo "$binary is not an executable: build trainerd first (ninja trainerd)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The path only where it ends (a space or the end of the line), so a
# /usr/bin/trainerd-something would stay as shipped; sed's replacement
# specials (\ & |) in the binary's path are escaped.
replacement=$(printf '%s' "$binary" | sed 's/[\\&|]/\\&/g')
for unit in trainerd.service trainerd.socket; do
  sed -e "s|/usr/bin/trainerd |$replacement |g" -e "s|/usr/bin/trainerd\$|$replacement|" "$src/$unit" > "$tmp/$unit"
done
# The service runs the built binary; every other line is as shipped.
shipped=$(grep '^ExecStart=' "$src/trainerd.service")
case $shipped in
  "ExecStart=/usr/bin/trainerd" | "ExecStart=/usr/bin/trainerd "*) ;;
  *) echo "trainerd.service: '$shipped' does not run /usr/bin/trainerd"; exit 1 ;;
esac
grep -qxF "ExecStart=$binary${shipped#ExecStart=/usr/bin/trainerd}" "$tmp/trainerd.service" ||
  { echo "trainerd.service: ExecStart= was not rewritten to $binary:"; grep '^ExecStart=' "$tmp/trainerd.service"; exit 1; }
for unit in trainerd.service trainerd.socket; do
  diff <(grep -v '^ExecStart=' "$src/$unit") <(grep -v '^ExecStart=' "$tmp/$unit") >/dev/null ||
    { echo "$unit: rewriting /usr/bin/trainerd changed more than ExecStart="; exit 1; }
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
