#!/usr/bin/env bash
# Real destinations on loopback for tests and benchmarks: Samba, OpenSSH
# (SFTP), MinIO (S3) and Toxiproxy in front of each.
#
#   scripts/servers.sh start DIR   install what is missing, start everything,
#                                  write DIR/env (source it for the URLs)
#   scripts/servers.sh stop DIR    stop what `start` started (by PID only)
#
# As root it also starts a distributed MinIO (4 nodes × 2 drives, each node
# in a network namespace of its own: scripts/cluster.sh) and writes its URL
# into DIR/env; where namespaces cannot be made it says why and goes on
# without it.
#
# Ports (all on 127.0.0.1): Samba 4450, sshd 2222, MinIO 9000 (its console
# 9001), Toxiproxy API 8474; through the proxy: Samba 14450, sshd 12222,
# MinIO 19000.
# CAPSULE_SERVERS_PORT_OFFSET=N adds N to every port, so a second set (a
# benchmark beside a test run) can run at once; its distributed store gets
# names and a bridge of its own, or those CAPSULE_CLUSTER_TAG and
# CAPSULE_CLUSTER_NET give.
# Everything is idempotent; a second `start` on the same DIR is a no-op.
set -euo pipefail

cmd=${1:?usage: servers.sh start|stop DIR}
dir=${2:?usage: servers.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
tools=${CAPSULE_TOOLS_DIR:-$HOME/.cache/capsule-servers/bin}

off=${CAPSULE_SERVERS_PORT_OFFSET:-0}
SMB_PORT=$((4450 + off)) SSH_PORT=$((2222 + off)) S3_PORT=$((9000 + off)) PROXY_API=$((8474 + off))
S3_CONSOLE=$((9001 + off))
SMB_PROXY=$((14450 + off)) SSH_PROXY=$((12222 + off)) S3_PROXY=$((19000 + off))
USER_NAME=backup PASSWORD=capsule-test-pw
# The append-only SFTP account and the requests its server refuses.
AO_USER=capsule-ao
AO_DENIED=remove,rmdir,rename,posix-rename,setstat,fsetstat,lsetstat,hardlink,symlink,copy-data
S3_KEY=capsule S3_SECRET=capsule-secret-key

log() { echo "servers: $*" >&2; }

wait_port() { # port seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  log "nothing listens on 127.0.0.1:$1 after $2 s"
  return 1
}

install_packages() {
  local missing=()
  command -v smbd >/dev/null || missing+=(samba)
  command -v smbclient >/dev/null || missing+=(smbclient)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null || missing+=(openssh-client)
  command -v curl >/dev/null || missing+=(curl)
  # The distributed store's namespaces; the clock-skew test's client.
  command -v ip >/dev/null || missing+=(iproute2)
  command -v faketime >/dev/null || missing+=(faketime)
  # The lab's report test renders HTML in headless Chromium and mounts a
  # small ext4 image for the nearly-full destination.
  command -v chromium >/dev/null || missing+=(chromium)
  command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  mkdir -p "$tools"
  if [ ! -x "$tools/minio" ]; then
    log "building MinIO (go install, a few minutes)"
    GOBIN="$tools" GOFLAGS=-mod=mod go install github.com/minio/minio@latest
  fi
  if [ ! -x "$tools/toxiproxy" ]; then
    log "building Toxiproxy"
    GOBIN="$tools" go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0
    mv "$tools/server" "$tools/toxiproxy"
  fi
}

start_samba() {
  local s="$dir/samba"
  mkdir -p "$s"/{share,private,lock,state,cache,pid,sync-share,sealed-share}
  chmod 0777 "$s/share" "$s/sync-share" "$s/sealed-share"
  cat >"$s/smb.conf" <<EOF
[global]
  interfaces = lo
  bind interfaces only = yes
  smb ports = $SMB_PORT
  disable netbios = yes
  server min protocol = SMB2
  server role = standalone server
  passdb backend = tdbsam:$s/private/passdb.tdb
  pid directory = $s/pid
  lock directory = $s/lock
  state directory = $s/state
  cache directory = $s/cache
  private dir = $s/private
  ncalrpc dir = $s/state/ncalrpc
  log file = $s/log.%m
  max log size = 1000
  load printers = no
  printing = bsd
  printcap name = /dev/null
  map to guest = never
[backup]
  path = $s/share
  read only = no
  valid users = $USER_NAME
  strict sync = yes
  force user = root
[syncall]
  path = $s/sync-share
  read only = no
  valid users = $USER_NAME
  strict sync = yes
  sync always = yes
  force user = root
[sealed]
  path = $s/sealed-share
  read only = no
  valid users = $USER_NAME
  strict sync = yes
  server smb encrypt = required
  force user = root
EOF
  id "$USER_NAME" >/dev/null 2>&1 || useradd -M "$USER_NAME"
  (echo "$PASSWORD"; echo "$PASSWORD") | smbpasswd -c "$s/smb.conf" -s -a "$USER_NAME" >/dev/null
  smbd -s "$s/smb.conf" -D
  wait_port "$SMB_PORT" 20
  # smbd -D forks; its pid file is the daemon's.
  local i
  for ((i = 0; i < 50; i++)); do
    [ -s "$s/pid/smbd-smb.conf.pid" ] || [ -s "$s/pid/smbd.pid" ] && break
    sleep 0.1
  done
  cat "$s"/pid/smbd*.pid >"$dir/samba.pid"
}

start_sshd() {
  local s="$dir/ssh"
  mkdir -p "$s"
  # The password-login account must reach its home below; the private keys
  # themselves stay 0600.
  chmod 755 "$dir" "$s"
  [ -f "$s/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$s/host_key"
  [ -f "$s/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$s/client_key"
  mkdir -p "$s/home"
  cp "$s/client_key.pub" "$s/authorized_keys"
  # Public keys; sshd reads the file as the user logging in (the
  # append-only account below is not root).
  chmod 644 "$s/authorized_keys"
  # The same account as Samba's, with a password, for password logins.
  id "$USER_NAME" >/dev/null 2>&1 || useradd -M "$USER_NAME"
  echo "$USER_NAME:$PASSWORD" | chpasswd
  mkdir -p "$s/pwhome"
  chown "$USER_NAME" "$s/pwhome"
  # An append-only account (the README's): it may create files and
  # directories, read and list, and nothing else; not root, so the
  # read-only objects capsule writes hold against it.
  id "$AO_USER" >/dev/null 2>&1 || useradd -M "$AO_USER"
  # No password, but not locked: sshd (without PAM) refuses a locked one.
  usermod -p '*' "$AO_USER"
  mkdir -p "$s/aohome"
  chown "$AO_USER" "$s/aohome"
  cat >"$s/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $s/host_key
PidFile $s/sshd.pid
AuthorizedKeysFile $s/authorized_keys
PermitRootLogin yes
PasswordAuthentication yes
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
MaxSessions 64
MaxStartups 64:30:128
Match User $AO_USER
    ForceCommand internal-sftp -P $AO_DENIED
EOF
  mkdir -p /run/sshd
  /usr/sbin/sshd -f "$s/sshd_config" -E "$s/sshd.log"
  wait_port "$SSH_PORT" 20
  cat "$s/sshd.pid" >"$dir/sshd.pid"
  # known_hosts line for the server and for the proxied port.
  local key
  key=$(cut -d' ' -f1,2 "$s/host_key.pub")
  printf '[127.0.0.1]:%s %s\n[127.0.0.1]:%s %s\n' "$SSH_PORT" "$key" "$SSH_PROXY" "$key" >"$s/known_hosts"
}

start_minio() {
  # Data left by an earlier start was made under other credentials, and
  # MinIO would refuse this run's keys: test data only, so start empty.
  rm -rf "$dir/minio/data"
  mkdir -p "$dir/minio/data"
  MINIO_ROOT_USER=$S3_KEY MINIO_ROOT_PASSWORD=$S3_SECRET MINIO_BROWSER=off \
    setsid "$tools/minio" server "$dir/minio/data" --address "127.0.0.1:$S3_PORT" \
    --console-address "127.0.0.1:$S3_CONSOLE" >"$dir/minio/log" 2>&1 &
  echo $! >"$dir/minio.pid"
  wait_port "$S3_PORT" 60
  local i
  for ((i = 0; i < 100; i++)); do
    curl -fs "http://127.0.0.1:$S3_PORT/minio/health/ready" >/dev/null && break
    sleep 0.2
  done
  # The test bucket, made with curl's own SigV4 signing (no extra client).
  curl -fs -X PUT --user "$S3_KEY:$S3_SECRET" --aws-sigv4 "aws:amz:us-east-1:s3" \
    "http://127.0.0.1:$S3_PORT/capsule-test" >/dev/null || {
    curl -fs --user "$S3_KEY:$S3_SECRET" --aws-sigv4 "aws:amz:us-east-1:s3" \
      "http://127.0.0.1:$S3_PORT/capsule-test?location" >/dev/null || { log "cannot create the test bucket"; return 1; }
  }
}

start_proxy() {
  setsid "$tools/toxiproxy" -host 127.0.0.1 -port "$PROXY_API" >"$dir/toxiproxy.log" 2>&1 &
  echo $! >"$dir/toxiproxy.pid"
  wait_port "$PROXY_API" 20
  local name listen upstream
  for spec in "smb:$SMB_PROXY:$SMB_PORT" "sftp:$SSH_PROXY:$SSH_PORT" "s3:$S3_PROXY:$S3_PORT"; do
    IFS=: read -r name listen upstream <<<"$spec"
    curl -fs -X POST "http://127.0.0.1:$PROXY_API/proxies" \
      -d "{\"name\":\"$name\",\"listen\":\"127.0.0.1:$listen\",\"upstream\":\"127.0.0.1:$upstream\"}" >/dev/null
  done
}

write_env() {
  cat >"$dir/env" <<EOF
export CAPSULE_TEST_SERVERS=$dir
export CAPSULE_TEST_SMB=smb://$USER_NAME@127.0.0.1:$SMB_PORT/backup
export CAPSULE_TEST_SMB_SYNC=smb://$USER_NAME@127.0.0.1:$SMB_PORT/syncall
export CAPSULE_TEST_SMB_SEALED=smb://$USER_NAME@127.0.0.1:$SMB_PORT/sealed
export CAPSULE_TEST_SMB_PASSWORD=$PASSWORD
export CAPSULE_TEST_SFTP=sftp://root@127.0.0.1:$SSH_PORT$dir/ssh/home
export CAPSULE_TEST_SFTP_KEY=$dir/ssh/client_key
export CAPSULE_TEST_SFTP_PASSWORD=$PASSWORD
export CAPSULE_TEST_SFTP_APPEND_ONLY=sftp://$AO_USER@127.0.0.1:$SSH_PORT$dir/ssh/aohome
export CAPSULE_TEST_SFTP_APPEND_ONLY_DIR=$dir/ssh/aohome
export CAPSULE_TEST_SFTP_PASSWORD_URL=sftp://$USER_NAME@127.0.0.1:$SSH_PORT$dir/ssh/pwhome
export CAPSULE_TEST_KNOWN_HOSTS=$dir/ssh/known_hosts
export CAPSULE_TEST_S3=s3+http://127.0.0.1:$S3_PORT/capsule-test
export CAPSULE_TEST_S3_KEY=$S3_KEY
export CAPSULE_TEST_S3_SECRET=$S3_SECRET
export CAPSULE_TEST_S3_UPSTREAM=127.0.0.1:$S3_PORT
export CAPSULE_TEST_SMB_UPSTREAM=127.0.0.1:$SMB_PORT
export CAPSULE_TEST_SFTP_UPSTREAM=127.0.0.1:$SSH_PORT
export CAPSULE_TEST_SMB_DIR=$dir/samba/share
export CAPSULE_TEST_SMB_SEALED_DIR=$dir/samba/sealed-share
export CAPSULE_TEST_SFTP_DIR=$dir/ssh/home
export CAPSULE_TEST_PROXY_API=http://127.0.0.1:$PROXY_API
export CAPSULE_TEST_SMB_PROXY_PORT=$SMB_PROXY
export CAPSULE_TEST_SFTP_PROXY_PORT=$SSH_PROXY
export CAPSULE_TEST_S3_PROXY_PORT=$S3_PROXY
EOF
}

start_cluster() {
  if [ "$(id -u)" != 0 ]; then
    log "no distributed store: network namespaces need root (its tests skip)"
    return 0
  fi
  # A second set of servers gets a cluster of its own names and addresses.
  local tag=capsule net=10.231.77
  if [ "$off" != 0 ]; then tag="capsule$((off % 1000))" net="10.231.$((78 + off % 150))"; fi
  # Names given by the caller come first.
  tag=${CAPSULE_CLUSTER_TAG:-$tag} net=${CAPSULE_CLUSTER_NET:-$net}
  if CAPSULE_CLUSTER_TAG=$tag CAPSULE_CLUSTER_NET=$net "$(dirname "$0")/cluster.sh" start "$dir"; then
    cat "$dir/cluster.env" >>"$dir/env"
  else
    log "the distributed store did not start (see above); its tests fail under CAPSULE_REQUIRE_SERVERS=1"
  fi
}

stop_pidfile() {
  local f="$dir/$1.pid"
  [ -f "$f" ] || return 0
  local pid
  pid=$(cat "$f")
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

case "$cmd" in
  start)
    if [ -f "$dir/env" ] && [ -f "$dir/toxiproxy.pid" ] && kill -0 "$(cat "$dir/toxiproxy.pid")" 2>/dev/null; then
      exit 0
    fi
    install_packages
    start_samba
    start_sshd
    start_minio
    start_proxy
    write_env
    start_cluster
    log "ready; source $dir/env"
    ;;
  stop)
    [ -f "$dir/cluster/names" ] && "$(dirname "$0")/cluster.sh" stop "$dir"
    for p in toxiproxy minio sshd samba; do stop_pidfile "$p"; done
    ;;
  *) echo "usage: servers.sh start|stop DIR" >&2; exit 2 ;;
esac
