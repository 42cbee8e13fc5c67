#!/usr/bin/env bash
# scrapekit's bulk recipe against Scrapy's bulk spider, one run, same local server and URL list
# (../shared/bench harness). Runs alternate (Scrapy, scrapekit, Scrapy, ...) so both see the same
# machine load; prints medians, peak RSS and the ratio, and appends raw records to bench/results/.
#   bash bench/bulk.sh                    # N=20000 URLs, REPEAT=3, concurrency 32
#   N=2000 REPEAT=1 bash bench/bulk.sh    # smoke
# Env: HARNESS (../shared/bench) VENV (/tmp/benchvenv, Scrapy's venv) PORT (8899) N REPEAT C WORK
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HARNESS="${HARNESS:-$ROOT/../shared/bench}"
VENV="${VENV:-/tmp/benchvenv}"
PORT="${PORT:-8899}"
N="${N:-20000}"
REPEAT="${REPEAT:-3}"
C="${C:-32}"
WORK="${WORK:-/tmp/scrapekit-bench-work}"
BASE="http://127.0.0.1:$PORT"
cd "$ROOT"
. bin/_setup.sh
ensure_venv "."
if [ ! -x "$VENV/bin/scrapy" ]; then
  "$PY" -m venv "$VENV" && "$VENV/bin/pip" install -q scrapy requests aiohttp psutil uvloop
fi
mkdir -p "$WORK" "$HERE/results"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RES="$HERE/results/bulk-$STAMP.jsonl"
URLS="$WORK/urls-$N.txt"

"$VENV/bin/python" "$HARNESS/site.py" --port "$PORT" --links 20 --pages 100000 --body-kb 15 --delay-ms 0 \
  --workers 1 --max-seconds 5400 > "$WORK/server-$STAMP.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do curl -s -o /dev/null --max-time 1 "$BASE/__stats" && break; sleep 0.1; done
"$VENV/bin/python" "$HARNESS/urls.py" --n "$N" --base "$BASE" --out "$URLS"

cat > "$WORK/bulk.yaml" <<YAML
name: bulk
work_dir: $WORK/sk
source: {type: flat_file, path: $URLS}
politeness: {allow_private: true, robots: false, per_domain: $C}
fetch: {type: http, concurrency: $C, timeout: 30s, max_bytes: 200KB}
store: {type: chunked_tsv}
log: {progress_interval: 1d, progress_every: 1000000}
YAML

M() { "$VENV/bin/python" "$HARNESS/measure.py" --server "$BASE" --repeat 1 --jsonl "$RES" "$@" | grep SUMMARY || true; }
for i in $(seq 1 "$REPEAT"); do
  M --label scrapy-bulk-c$C --count-lines "$WORK/scrapy.jsonl" --pre "rm -f $WORK/scrapy.jsonl" \
    -- "$VENV/bin/scrapy" runspider "$HARNESS/clients/scrapy_bulk.py" -a urls_file="$URLS" \
       -s CONCURRENT_REQUESTS=$C -s CONCURRENT_REQUESTS_PER_DOMAIN=$C -O "$WORK/scrapy.jsonl"
  M --label scrapekit-bulk-c$C --pre "rm -rf $WORK/sk" \
    -- "$ROOT/.venv/bin/scrapekit" run "$WORK/bulk.yaml" --no-console
done
"$ROOT/.venv/bin/python" "$HERE/compare.py" "$RES" "scrapy-bulk-c$C" "scrapekit-bulk-c$C"
