#!/usr/bin/env bash
# Time from `scrapekit run` to the first fetched page when the LevelDB queue already holds
# JOBS jobs (loaded with `scrapekit load`), against the shared harness site. Bar: under 2 s.
#   bash bench/reopen.sh          # JOBS=1000000 REPEAT=3
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
HARNESS="${HARNESS:-$ROOT/../shared/bench}"
VENV="${VENV:-/tmp/benchvenv}"
PORT="${PORT:-8897}"
JOBS="${JOBS:-1000000}"
REPEAT="${REPEAT:-3}"
WORK="${WORK:-/tmp/scrapekit-bench-work}/reopen"
BASE="http://127.0.0.1:$PORT"
cd "$ROOT"
. bin/_setup.sh
ensure_venv "."
mkdir -p "$WORK"
"$VENV/bin/python" "$HARNESS/site.py" --port "$PORT" --pages "$JOBS" --workers 1 --max-seconds 3600 > "$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do curl -s -o /dev/null --max-time 1 "$BASE/__stats" && break; sleep 0.1; done
"$VENV/bin/python" "$HARNESS/urls.py" --n "$JOBS" --pages "$JOBS" --base "$BASE" --out "$WORK/urls.txt"
: > "$WORK/empty.txt"
rm -rf "$WORK/sk"
cat > "$WORK/reopen.yaml" <<YAML
name: reopen
work_dir: $WORK/sk
source: {type: flat_file, path: $WORK/empty.txt}
politeness: {allow_private: true, robots: false, per_domain: 0}
store: {type: chunked_tsv}
YAML
SK="$ROOT/.venv/bin/scrapekit"
start=$(date +%s.%N); "$SK" load "$WORK/reopen.yaml" "$WORK/urls.txt"; end=$(date +%s.%N)
echo "load of $JOBS lines: $(echo "$end - $start" | bc) s"
for i in $(seq 1 "$REPEAT"); do
  start=$(date +%s.%N)
  "$SK" run "$WORK/reopen.yaml" --max-requests 1 --no-console
  end=$(date +%s.%N)
  echo "run $i: start, reopen the queue of $("$SK" status "$WORK/reopen.yaml" --json | "$ROOT/.venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["queued"])') jobs, fetch 1 page, stop: $(echo "$end - $start" | bc) s"
done
