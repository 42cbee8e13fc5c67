#!/usr/bin/env bash
# Peak RSS of a run fed from a 10-million-line URL file, against a run fed from 10,000 lines:
# the source reads lazily (at most `window` jobs ahead), so memory must not grow with the file.
# Each run lasts SECONDS (limits.max_seconds) against the shared harness site; RSS is sampled
# every second from /proc.
#   bash bench/flat_memory.sh            # LINES=10000000 SECONDS_=60
# Env: HARNESS (../shared/bench) VENV (/tmp/benchvenv) PORT (8898) LINES SECONDS_ WORK
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HARNESS="${HARNESS:-$ROOT/../shared/bench}"
VENV="${VENV:-/tmp/benchvenv}"
PORT="${PORT:-8898}"
LINES="${LINES:-10000000}"
SECONDS_="${SECONDS_:-60}"
WORK="${WORK:-/tmp/scrapekit-bench-work}/flat"
BASE="http://127.0.0.1:$PORT"
cd "$ROOT"
. bin/_setup.sh
ensure_venv "."
[ -x "$VENV/bin/python" ] || { "$PY" -m venv "$VENV" && "$VENV/bin/pip" install -q scrapy requests aiohttp psutil uvloop; }
mkdir -p "$WORK"
"$VENV/bin/python" "$HARNESS/site.py" --port "$PORT" --links 20 --pages "$LINES" --body-kb 15 --workers 1 \
  --max-seconds 3600 > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do curl -s -o /dev/null --max-time 1 "$BASE/__stats" && break; sleep 0.1; done
[ -s "$WORK/urls-$LINES.txt" ] || "$VENV/bin/python" "$HARNESS/urls.py" --n "$LINES" --pages "$LINES" --base "$BASE" --out "$WORK/urls-$LINES.txt"
[ -s "$WORK/urls-10000.txt" ] || head -n 10000 "$WORK/urls-$LINES.txt" > "$WORK/urls-10000.txt"

for n in ${SIZES:-10000 $LINES}; do
  rm -rf "$WORK/sk-$n"
  cat > "$WORK/flat-$n.yaml" <<YAML
name: flat
work_dir: $WORK/sk-$n
source: {type: flat_file, path: $WORK/urls-$n.txt}
politeness: {allow_private: true, robots: false, per_domain: 0}
fetch: {concurrency: 32}
store: {type: chunked_tsv}
limits: {max_seconds: ${SECONDS_}s}
log: {progress_interval: 1d, progress_every: 100000000}
YAML
  "$ROOT/.venv/bin/scrapekit" run "$WORK/flat-$n.yaml" --no-console &
  RUN=$!
  samples=()
  while kill -0 "$RUN" 2>/dev/null; do
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$RUN/status" 2>/dev/null || true)
    [ -n "$rss" ] && samples+=("$rss")
    sleep 1
  done
  wait "$RUN"
  done_n=$(cat "$WORK/sk-$n"/flat/out/*/*.tsv | wc -l)
  printf '%s\n' "${samples[@]}" | "$ROOT/.venv/bin/python" -c "
import sys
s = [int(x) / 1024 for x in sys.stdin.read().split()]
marks = ' '.join(f'{t}s:{s[t]:.0f}' for t in range(10, len(s), 30))
print(f'| {int(\"$n\"):,} lines | {len(s)} s | {int(\"$done_n\"):,} pages | {marks} | peak {max(s):.0f} MB |')"
done
