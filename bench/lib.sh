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

