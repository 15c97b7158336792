#!/usr/bin/env bash
# Starts or stops a Docker daemon of our own, for machines without systemd (CI, these dev machines).
#   scripts/dockerd.sh start   installs Debian's docker.io and docker-compose when missing, starts dockerd in
#                              its own session unless one already answers, waits for it (bounded)
#   scripts/dockerd.sh stop    stops the dockerd this script started, by its PID; leaves any other alone
# The PID and the daemon's log are in var/docker/ (dockerd.pid, dockerd.log).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=var/docker
PIDFILE=$STATE/dockerd.pid
mkdir -p "$STATE"

case "${1:-}" in
start)
  if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io docker-compose >/dev/null
  fi
  if docker info >/dev/null 2>&1; then
    echo "dockerd: one already answers; not starting another"
    exit 0
  fi
  setsid dockerd >"$STATE/dockerd.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  for _ in $(seq 60); do
    if docker info >/dev/null 2>&1; then
      echo "dockerd: started, pid $(cat "$PIDFILE") (log $STATE/dockerd.log)"
      exit 0
    fi
    sleep 1
  done
  echo "dockerd did not answer within 60 s; its log ($STATE/dockerd.log):" >&2
  tail -20 "$STATE/dockerd.log" >&2
  exit 1
  ;;
stop)
  [ -f "$PIDFILE" ] || { echo "dockerd: no PID file, nothing of ours to stop"; exit 0; }
  pid=$(cat "$PIDFILE")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "dockerd $pid still running after 30 s" >&2
      exit 1
    fi
  fi
  rm -f "$PIDFILE"
  echo "dockerd: stopped"
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
