# Shared by the benchmark scripts (sourced; needs $api, the Toxiproxy API).

# proxy NAME UPSTREAM RTT_MS -> prints host:port to use
proxy() {
  local name=$1 upstream=$2 rtt=$3
  if [ "$rtt" = 0 ]; then echo "$upstream"; return; fi
  curl -fs -X DELETE "$api/proxies/$name" >/dev/null 2>&1 || true
  local listen
  listen=$(curl -fs -X POST "$api/proxies" \
    -d "{\"name\":\"$name\",\"listen\":\"127.0.0.1:0\",\"upstream\":\"$upstream\"}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["listen"])')
  local half=$((rtt / 2)) ; [ "$half" -lt 1 ] && half=1
  for dir in upstream downstream; do
    curl -fs -X POST "$api/proxies/$name/toxics" \
      -d "{\"name\":\"lat_$dir\",\"type\":\"latency\",\"stream\":\"$dir\",\"attributes\":{\"latency\":$half}}" >/dev/null
  done
  echo "$listen"
}


# use_servers: sets $servers and $api, sources the servers' env, and arranges
# for $work (and servers this script started) to go at exit. Reuses servers
# already started with scripts/servers.sh when CAPSULE_TEST_SERVERS is set.
use_servers() {
  if [ -n "${CAPSULE_TEST_SERVERS:-}" ] && [ -f "$CAPSULE_TEST_SERVERS/env" ]; then
    servers=$CAPSULE_TEST_SERVERS
    trap 'rm -rf "$work"' EXIT
  else
    servers=$work/servers
    trap 'scripts/servers.sh stop "$servers"; rm -rf "$work"' EXIT
    scripts/servers.sh start "$servers"
  fi
  # shellcheck disable=SC1091
  source "$servers/env"
  api=$CAPSULE_TEST_PROXY_API
}

# proxies NAME-SUFFIX RTT: sets $smb, $sftp, $s3 (host:port through
# Toxiproxy at RTT ms) and CAPSULE_SFTP_KNOWN_HOSTS for the SFTP proxy.
proxies() {
  smb=$(proxy "smb-$1" "$CAPSULE_TEST_SMB_UPSTREAM" "$2")
  sftp=$(proxy "sftp-$1" "$CAPSULE_TEST_SFTP_UPSTREAM" "$2")
  s3=$(proxy "s3-$1" "$CAPSULE_TEST_S3_UPSTREAM" "$2")
  local kh="$work/kh-$1"
  printf '[%s]:%s %s\n' "${sftp%:*}" "${sftp#*:}" "$(cut -d' ' -f1,2 "$servers/ssh/host_key.pub")" >"$kh"
  export CAPSULE_SFTP_KNOWN_HOSTS=$kh
}
