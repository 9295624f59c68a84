#!/usr/bin/env bash
# kvtier's S3 test server: a throw-away single-node Ceph cluster (one monitor, one memstore OSD) with
# an S3 gateway (radosgw), all on 127.0.0.1 and on free ports. Data lives in memory; `stop` ends the
# daemons and removes DIR. Used by .ci/run; by hand:
#
#   bash tests/services/ceph-rgw.sh start DIR [PORT]   # PORT: the gateway's; default a free one
#   eval "$(cat DIR/env)"                              # exports KVTIER_TEST_S3_* for the tests
#   bash tests/services/ceph-rgw.sh stop DIR
#
# After `start`, DIR/env holds the test suite's variables (endpoint http://127.0.0.1:PORT, access key
# "kvtier", secret "kvtier-secret", path-style addressing) and the last line printed names the
# endpoint. Needs root and Debian's ceph-mon, ceph-osd and radosgw packages (apt-get installs them
# when missing). Well under a minute on a 2-core machine.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
port=${3:-}
[ -n "$dir" ] && { [ "$cmd" = start ] || [ "$cmd" = stop ]; } \
    || { echo "usage: $0 start DIR [PORT] | stop DIR" >&2; exit 2; }
conf=$dir/ceph.conf

stop() {
    local pids=() pid p
    for p in "$dir"/run/*.pid; do
        [ -f "$p" ] || continue
        pid=$(cat "$p" 2>/dev/null || true)
        [ -n "$pid" ] && pids+=("$pid") && kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do   # wait for each daemon to exit; force it after 10 s
        for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}

# A free loopback port, chosen by the kernel (bind to port 0), not in the arguments. Another process
# may take it before the daemon binds: the readiness checks below then fail with the log's path.
free_port() {
    python3 - "$@" <<'PY'
import socket, sys
taken = {int(a) for a in sys.argv[1:]}
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port not in taken:
        print(port)
        break
PY
}

if [ "$cmd" = stop ]; then stop; exit 0; fi

if ! command -v radosgw >/dev/null || ! command -v ceph-osd >/dev/null || ! command -v ceph-mon >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends ceph-mon ceph-osd radosgw >/dev/null
fi

[ -d "$dir" ] && stop
mkdir -p "$dir"/run "$dir"/log "$dir"/mon.a "$dir"/osd.0 "$dir"/rgw
chmod 0700 "$dir"
[ -n "$port" ] || port=$(free_port)
mon_v2=$(free_port "$port")
mon_v1=$(free_port "$port" "$mon_v2")
mon_addrs="[v2:127.0.0.1:$mon_v2,v1:127.0.0.1:$mon_v1]"
fsid=$(cat /proc/sys/kernel/random/uuid)
cat >"$conf" <<CONF
[global]
fsid = $fsid
mon initial members = a
mon host = $mon_addrs
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc
ms client mode = crc
ms mon cluster mode = crc
ms mon service mode = crc
ms cluster mode = crc
ms service mode = crc
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
keyring = $dir/keyring
[mon]
mon data = $dir/mon.\$id
[osd]
osd data = $dir/osd.\$id
osd objectstore = memstore
memstore device bytes = 4294967296
osd op num threads per shard = 1
osd op num shards = 2
[client.rgw.0]
rgw frontends = beast endpoint=127.0.0.1:$port
rgw data = $dir/rgw
rgw thread pool size = 64
CONF

ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
monmaptool --create --addv a "$mon_addrs" --fsid "$fsid" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" >/dev/null 2>&1
ceph-mon -c "$conf" -i a
uuid=$(cat /proc/sys/kernel/random/uuid)
id=$(timeout 60 ceph -c "$conf" osd new "$uuid")
ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" >/dev/null 2>&1
ceph-osd -c "$conf" -i "$id"
radosgw -c "$conf" -n client.rgw.0 --no-mon-config
for _ in $(seq 1 120); do
    if timeout 10 radosgw-admin -c "$conf" user create --uid=kvtier --display-name=kvtier \
         --access-key=kvtier --secret=kvtier-secret >/dev/null 2>&1; then break; fi
    sleep 1
done
for _ in $(seq 1 60); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then
        # KVTIER_TEST_* belong to the test suite (the config layers never read them as settings).
        umask 077
        cat >"$dir/env" <<ENV
export KVTIER_TEST_S3_ENDPOINT=http://127.0.0.1:$port
export KVTIER_TEST_S3_ACCESS_KEY=kvtier KVTIER_TEST_S3_SECRET_KEY=kvtier-secret
export KVTIER_TEST_CEPH_DIR=$dir
ENV
        echo "ceph-rgw: S3 endpoint http://127.0.0.1:$port (access key kvtier / kvtier-secret); variables in $dir/env"
        exit 0
    fi
    sleep 1
done
echo "ceph-rgw: gateway did not answer on 127.0.0.1:$port; logs in $dir/log" >&2
exit 1
