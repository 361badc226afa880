#!/usr/bin/env bash
# One command to set den up on a fresh Debian/Ubuntu host and start it:
# installs the Debian packages den needs, builds den into /usr/local/bin,
# and starts `den serve` (as a systemd service where systemd runs, else in
# the background with its log in /var/log/den.log). Run it as root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "up.sh: run as root (sudo ./scripts/up.sh): den serve creates namespaces, cgroups and mounts" >&2
  exit 1
fi
source scripts/deps.sh
echo "up.sh: building den" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(git describe --always --dirty 2>/dev/null || echo dev)" -o /usr/local/bin/den.new ./cmd/den
mv /usr/local/bin/den.new /usr/local/bin/den

sock=/run/den/den.sock
if [ -d /run/systemd/system ]; then
  cat > /etc/systemd/system/den.service <<'UNIT'
[Unit]
Description=den sandbox daemon
After=network.target

[Service]
ExecStart=/usr/local/bin/den serve
KillMode=process
Restart=on-failure
Delegate=yes

[Install]
WantedBy=multi-user.target
UNIT
  systemctl daemon-reload
  systemctl enable den.service >/dev/null
  systemctl restart den.service
else
  if [ -S "$sock" ] && den version >/dev/null 2>&1; then
    pkill -TERM -x -f "/usr/local/bin/den serve" || true
    sleep 1
  fi
  nohup /usr/local/bin/den serve >>/var/log/den.log 2>&1 &
fi
for _ in $(seq 1 100); do
  if den version >/dev/null 2>&1; then
    den version
    echo
    echo "den is running. Try:  den run --rm -- sh -c 'echo hello from \$(hostname)'"
    exit 0
  fi
  sleep 0.1
done
echo "up.sh: den serve did not answer on $sock; see /var/log/den.log or journalctl -u den" >&2
exit 1
