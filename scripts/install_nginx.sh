#!/usr/bin/env bash
# Install Debian's nginx-light for the benchmark's nginx comparator (loadtest/bench_proxy.py), without
# starting the system service: the benchmark runs its own nginx on a free port with its own config.
# Exit status 0 when an nginx binary is available afterwards, 1 otherwise (the benchmark then skips nginx).
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_nginx: no apt-get here; install nginx yourself to get the nginx comparator" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "install_nginx: not root and no password-less sudo; cannot install nginx-light" >&2
    exit 1
  fi
fi
# policy-rc.d exit 101 = "do not start services from maintainer scripts" (only if none is in place).
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
  $SUDO chmod +x "$POLICY"
  ADDED_POLICY=1
fi
cleanup() { if [ "$ADDED_POLICY" = 1 ]; then $SUDO rm -f "$POLICY"; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends nginx-light >/tmp/install_nginx.$$.log 2>&1; then
  $SUDO apt-get update -q >/dev/null 2>&1 || true
  $SUDO apt-get install -y -q --no-install-recommends nginx-light >/tmp/install_nginx.$$.log 2>&1 || {
    echo "install_nginx: apt-get install nginx-light failed:" >&2; tail -5 /tmp/install_nginx.$$.log >&2
    rm -f /tmp/install_nginx.$$.log; exit 1; }
fi
rm -f /tmp/install_nginx.$$.log
[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null 2>&1
