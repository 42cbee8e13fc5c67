#!/usr/bin/env bash
# scrapekit with 1, 2 and 4 worker processes (`scrapekit run R --workers N`, one shared beanstalkd),
# bulk and crawl, against K copies of the harness site on K loopback addresses (K/4 of them in
# each of the 4 shards, see bench/multihost_site.py), all in one run on this machine. Worker counts
# alternate within each repeat (rotated from repeat to repeat); a fresh beanstalkd (free port,
# binlog in a temp dir) for every run. Prints medians, RSS, CPU and the ratio to 1 worker, and
# appends raw records to bench/results/workers-<stamp>.jsonl.
#   bash bench/workers.sh                          # N=20000 URLs, PAGES=20000, REPEAT=3, C=32
#   N=2000 REPEAT=1 bash bench/workers.sh          # smoke (PAGES follows N)
#   MODES=bulk WORKERS="1 2" bash bench/workers.sh     # a part; WORKERS 0 = plain run, no --workers
# Env: HARNESS (../shared/bench) VENV (/tmp/benchvenv) PORT (8893) HOSTS (K, 8) N PAGES REPEAT C
#      MODES ("bulk crawl") WORKERS ("1 2 4") TIMEOUT (900 s a run) WORK
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HARNESS="${HARNESS:-$ROOT/../shared/bench}"
VENV="${VENV:-/tmp/benchvenv}"
PORT="${PORT:-8893}"
HOSTS="${HOSTS:-8}"
N="${N:-20000}"
PAGES="${PAGES:-$N}"
REPEAT="${REPEAT:-3}"
C="${C:-32}"
MODES="${MODES:-bulk crawl}"
WORKERS="${WORKERS:-1 2 4}"
TIMEOUT="${TIMEOUT:-900}"
WORK="${WORK:-/tmp/scrapekit-bench-work}/workers"
STATS="http://127.0.0.1:$PORT"
cd "$ROOT"
. bin/_setup.sh
ensure_venv "."
ensure_beanstalkd
BEANSTALKD="$(command -v beanstalkd || echo /usr/bin/beanstalkd)"
"$VENV/bin/python" -c 'import psutil, uvloop' 2>/dev/null || { "$PY" -m venv "$VENV" && "$VENV/bin/pip" install -q psutil uvloop; }
mkdir -p "$WORK" "$HERE/results"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RES="$HERE/results/workers-$STAMP.jsonl"

# K addresses spread evenly over 4 shards (so over 2 as well: crc32 % 2 follows crc32 % 4).
.venv/bin/python "$HERE/multihost_site.py" hosts --count "$HOSTS" --shards 4 --port "$PORT" > "$WORK/hosts.txt"
"$VENV/bin/python" "$HERE/multihost_site.py" serve --hosts-file "$WORK/hosts.txt" --port "$PORT" \
  --harness "$HARNESS" --max-seconds 5400 -- --links 20 --pages 100000 --body-kb 15 --delay-ms 0 \
  > "$WORK/sites-$STAMP.log" 2>&1 &
SITES=$!
BPID=""
cleanup() {
  [ -n "$BPID" ] && { kill "$BPID" 2>/dev/null; wait "$BPID" 2>/dev/null; }
  kill "$SITES" 2>/dev/null; wait "$SITES" 2>/dev/null
}
trap cleanup EXIT INT TERM
for _ in $(seq 1 300); do curl -s -o /dev/null --max-time 1 "$STATS/__stats" && break; sleep 0.1; done
curl -s -o /dev/null --max-time 5 "$STATS/__stats" || { cat "$WORK/sites-$STAMP.log"; exit 1; }
echo "sites: $(tr '\n' ' ' < "$WORK/hosts.txt")port $PORT"

# bulk: N distinct pages, round-robin over the hosts; crawl: every host's /page/0.
awk -v n="$N" -v port="$PORT" '{h[c++] = $0} END {for (i = 0; i < n; i++) printf "http://%s:%d/page/%d\n", h[i % c], port, i}' \
  "$WORK/hosts.txt" > "$WORK/urls.txt"
awk -v port="$PORT" '{printf "http://%s:%d/page/0\n", $0, port}' "$WORK/hosts.txt" > "$WORK/start.txt"

recipe() {  # recipe MODE WORKERS BEANSTALK_PORT -> path
  local mode=$1 workers=$2 bport=$3 file="$WORK/$1.yaml"
  local common="politeness: {allow_private: true, robots: false, per_domain: $C}
queue: {type: beanstalk, url: 'beanstalk://127.0.0.1:$bport', tube: bench-$mode}
log: {progress_interval: 1d, progress_every: 100000000}"
  if [ "$mode" = bulk ]; then
    cat > "$file" <<YAML
name: bulk
work_dir: $WORK/sk
source: {type: flat_file, path: $WORK/urls.txt}
fetch: {type: http, concurrency: $C, timeout: 30s, max_bytes: 200KB}
store: {type: chunked_tsv}
$common
YAML
  else
    # limits.max_requests counts per worker process: the total budget divided among the workers
    # (the hosts are balanced, so every worker's shard has as much to crawl).
    cat > "$file" <<YAML
name: crawl
work_dir: $WORK/sk
source: {type: flat_file, path: $WORK/start.txt}
fetch: {concurrency: $C, timeout: 30s}
follow: {links: "//a/@href", allow: ['/page/\\d+\$']}
parse: {type: html, items: {each: /html, fields: {title: //title/text()}}}
store: [{type: chunked_tsv}, {type: jsonl, records: items}]
limits: {max_requests: $(( PAGES / (workers > 0 ? workers : 1) ))}
$common
YAML
  fi
  echo "$file"
}

free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

one_run() {  # one_run MODE WORKERS
  local mode=$1 workers=$2 bport file args label
  bport="$(free_port)"
  rm -rf "$WORK/binlog" && mkdir -p "$WORK/binlog"
  "$BEANSTALKD" -l 127.0.0.1 -p "$bport" -b "$WORK/binlog" &
  BPID=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$bport") 2>/dev/null && break; sleep 0.05; done
  file="$(recipe "$mode" "$workers" "$bport")"
  args=(run "$file" --no-console)
  [ "$workers" -gt 0 ] && args+=(--workers "$workers")
  label="scrapekit-$mode-w$workers-c$C"
  rm -f "$WORK/measured.jsonl"
  curl -s --max-time 5 "$STATS/__stats" > "$WORK/before.json"
  head -1 /proc/stat > "$WORK/stat-before"
  "$VENV/bin/python" "$HARNESS/measure.py" --server "$STATS" --repeat 1 --timeout "$TIMEOUT" \
    --label "$label" --pre "rm -rf $WORK/sk" --log "$WORK/$label.log" --jsonl "$WORK/measured.jsonl" \
    -- "$ROOT/.venv/bin/scrapekit" "${args[@]}" | grep SUMMARY || true
  head -1 /proc/stat > "$WORK/stat-after"
  curl -s --max-time 5 "$STATS/__stats" > "$WORK/after.json"
  .venv/bin/python "$HERE/workers_table.py" annotate "$WORK/measured.jsonl" "$RES" --mode "$mode" \
    --workers "$workers" --beanstalkd-pid "$BPID" --before "$WORK/before.json" --after "$WORK/after.json" \
    --cpu-before "$WORK/stat-before" --cpu-after "$WORK/stat-after"
  kill "$BPID"; wait "$BPID" 2>/dev/null || true
  BPID=""
}

read -r -a ORDER <<< "$WORKERS"
for mode in $MODES; do
  for i in $(seq 1 "$REPEAT"); do
    for j in "${!ORDER[@]}"; do  # rotate the order every repeat: 1 2 4, 2 4 1, 4 1 2, ...
      one_run "$mode" "${ORDER[$(( (i - 1 + j) % ${#ORDER[@]} ))]}"
    done
  done
done
echo
.venv/bin/python "$HERE/workers_table.py" table "$RES"
echo "raw records: $RES"
