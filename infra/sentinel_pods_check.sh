#!/usr/bin/env bash
# The Kubernetes render's Redis with Sentinel (shared/sloserve/render.py, _REDIS_INIT), run for
# real: 3 containers on a Docker network standing in for the StatefulSet's pods (aliases
# redis-K.redis, $HOSTNAME redis-K), each running the init script then redis-server and a
# sentinel as the pod does. Kills the first master, prints who was promoted and when,
# restarts the killed pod and prints that it rejoined as a replica. Needs Docker
# (../shared/tools/container-engine) and a redis:7-alpine image; about 40 s.
#   infra/sentinel_pods_check.sh
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/shared:$PWD/services${PYTHONPATH:+:$PYTHONPATH}
init=$(python -c "from sloserve.render import _REDIS_INIT; print(_REDIS_INIT)")
net=sentinel-check-net
docker network create $net >/dev/null
start() {
  docker run -d --name sentinel-check-$1 --hostname redis-$1 --network $net \
    --network-alias redis-$1.redis -e REDIS_PASSWORD=pw -e HOSTNAME=redis-$1 \
    --entrypoint sh redis:7-alpine -c "mkdir -p /conf && $init
redis-server /conf/redis.conf --daemonize yes && exec redis-server /conf/sentinel.conf --sentinel" >/dev/null
}
cli() { docker exec sentinel-check-$1 redis-cli "${@:2}" 2>/dev/null; }
for k in 0 1 2; do start $k; sleep 2; done
sleep 8
echo "master per sentinel: $(for k in 0 1 2; do cli $k -p 26379 sentinel get-master-addr-by-name sloserve | head -1; done | tr '\n' ' ')"
echo "replicas of redis-0: $(cli 0 -a pw info replication | grep connected_slaves)"
cli 0 -a pw set k before-failover >/dev/null
t0=$(date +%s.%N)
docker kill sentinel-check-0 >/dev/null
for i in $(seq 60); do
  m=$(cli 1 -p 26379 sentinel get-master-addr-by-name sloserve | head -1)
  [ "$m" != "redis-0.redis" ] && [ -n "$m" ] && break; sleep 0.5
done
t1=$(date +%s.%N)
echo "after killing redis-0: master $m after $(python -c "print(round($t1-$t0,1))") s"
h=${m%%.*}; k=${h##*-}
echo "value on the new master: $(cli $k -a pw get k)"
docker rm sentinel-check-0 >/dev/null; start 0; sleep 6
echo "restarted redis-0 role: $(cli 0 -a pw info replication | grep -E '^role|master_host' | tr '\r\n' '  ')"
echo "its value: $(cli 0 -a pw get k)"
for k in 0 1 2; do docker rm -f sentinel-check-$k >/dev/null; done
docker network rm $net >/dev/null
