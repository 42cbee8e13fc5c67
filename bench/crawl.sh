#!/usr/bin/env bash
# scrapekit crawl (link extraction, exact on-disk seen-set, durable LevelDB frontier) against
# Scrapy's CrawlSpider with JOBDIR (its disk queues), both from /page/0 of the shared harness
# site until 20,000 pages, alternating, in one run. Prints medians, peak RSS and the ratio.
#   bash bench/crawl.sh                    # PAGES=20000 REPEAT=3 C=32
# Env: HARNESS (../shared/bench) VENV (/tmp/benchvenv) PORT (8896) PAGES REPEAT C WORK
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HARNESS="${HARNESS:-$ROOT/../shared/bench}"
VENV="${VENV:-/tmp/benchvenv}"
PORT="${PORT:-8896}"
PAGES="${PAGES:-20000}"
REPEAT="${REPEAT:-3}"
C="${C:-32}"
WORK="${WORK:-/tmp/scrapekit-bench-work}/crawl"
BASE="http://127.0.0.1:$PORT"
cd "$ROOT"
. bin/_setup.sh
ensure_venv "."
[ -x "$VENV/bin/scrapy" ] || { "$PY" -m venv "$VENV" && "$VENV/bin/pip" install -q scrapy requests aiohttp psutil uvloop; }
mkdir -p "$WORK" "$HERE/results"
RES="$HERE/results/crawl-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
"$VENV/bin/python" "$HARNESS/site.py" --port "$PORT" --links 20 --pages 100000 --body-kb 15 --workers 1 \
  --max-seconds 5400 > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do curl -s -o /dev/null --max-time 1 "$BASE/__stats" && break; sleep 0.1; done
echo "$BASE/page/0" > "$WORK/start.txt"
cat > "$WORK/crawl.yaml" <<YAML
name: crawl
work_dir: $WORK/sk
source: {type: flat_file, path: $WORK/start.txt}
politeness: {allow_private: true, robots: false, per_domain: $C}
fetch: {concurrency: $C, timeout: 30s}
follow: {links: "//a/@href", allow: ['/page/\\d+\$']}
parse: {type: html, items: {each: /html, fields: {title: //title/text()}}}
store: [{type: chunked_tsv}, {type: jsonl, records: items}]
limits: {max_requests: $PAGES}
log: {progress_interval: 1d, progress_every: 100000000}
YAML
M() { "$VENV/bin/python" "$HARNESS/measure.py" --server "$BASE" --repeat 1 --jsonl "$RES" "$@" | grep SUMMARY || true; }
for i in $(seq 1 "$REPEAT"); do
  M --label scrapy-crawl-jobdir-c$C --count-lines "$WORK/scrapy.jsonl" --pre "rm -f $WORK/scrapy.jsonl; rm -rf $WORK/jobdir" \
    -- "$VENV/bin/scrapy" runspider "$HARNESS/clients/scrapy_crawl.py" -a start_url="$BASE/page/0" \
       -s CLOSESPIDER_PAGECOUNT=$PAGES -s CONCURRENT_REQUESTS=$C -s CONCURRENT_REQUESTS_PER_DOMAIN=$C \
       -s JOBDIR="$WORK/jobdir" -O "$WORK/scrapy.jsonl"
  M --label scrapekit-crawl-c$C --pre "rm -rf $WORK/sk" -- "$ROOT/.venv/bin/scrapekit" run "$WORK/crawl.yaml" --no-console
done
"$ROOT/.venv/bin/python" "$HERE/compare.py" "$RES" "scrapy-crawl-jobdir-c$C" "scrapekit-crawl-c$C"
