"""The harness site on several loopback addresses, for benchmarks that need several hosts.

  .venv/bin/python bench/multihost_site.py hosts --count 8 --shards 4 --port 8893
      K addresses among 127.0.0.2..127.0.0.254 that scrapekit.shards.shard_of spreads evenly
      over SHARDS shards (COUNT/SHARDS each; the lowest addresses of every shard), one a line.
      Needs scrapekit importable (the project's venv).

  $VENV/bin/python bench/multihost_site.py serve --hosts-file HOSTS --port 8893 [--harness DIR]
      [--max-seconds 5400] [-- SITE.PY FLAGS...]
      One site.py (one process each) per address on PORT, and on 127.0.0.1:PORT a /__stats
      that sums their counters and lists every site's pids, so that the harness measure.py
      (--server http://127.0.0.1:PORT) counts the pages and the server CPU of all of them.
      It also gives "hosts": {address: content_200} for checking how the work was spread.
      Prints READY when every site answers; stops them on SIGTERM/SIGINT or after max-seconds.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def pick_hosts(count: int, shards: int, port: int) -> list[str]:
    from scrapekit.shards import shard_of

    if count % shards:
        raise SystemExit(f"--count {count} is not a multiple of --shards {shards}")
    per_shard: dict[int, list[str]] = {i: [] for i in range(shards)}
    for last in range(2, 255):
        address = f"127.0.0.{last}"
        owners = per_shard[shard_of(f"http://{address}:{port}/", shards)]
        if len(owners) < count // shards:
            owners.append(address)
    chosen = sorted((a for owners in per_shard.values() for a in owners), key=ipaddress.ip_address)
    if len(chosen) != count:
        raise SystemExit(f"only {len(chosen)} balanced addresses for {count} hosts over {shards} shards")
    return chosen


def site_stats(address: str, port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/__stats", timeout=5) as response:
            stats: dict[str, Any] = json.loads(response.read())
            return stats
    except Exception:
        return None


def summed_stats(hosts: list[str], port: int) -> dict[str, Any]:
    total: dict[str, Any] = {"pids": [], "hosts": {}}
    for address in hosts:
        stats = site_stats(address, port) or {}
        for key, value in stats.items():
            if key == "pids":
                total["pids"].extend(value)
            elif isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
        total["hosts"][address] = stats.get("content_200")
    return total


def serve(args: argparse.Namespace) -> None:
    hosts = [line.strip() for line in Path(args.hosts_file).read_text().splitlines() if line.strip()]
    site_py = Path(args.harness) / "site.py"
    extra = args.site_args[1:] if args.site_args[:1] == ["--"] else args.site_args
    sites = [subprocess.Popen([sys.executable, str(site_py), "--host", address, "--port", str(args.port),
                               "--workers", "1", "--max-seconds", str(args.max_seconds), *extra],
                              stdout=subprocess.DEVNULL)
             for address in hosts]

    def stop_sites(*_: object) -> None:
        for site in sites:
            if site.poll() is None:
                site.terminate()
        for site in sites:
            try:
                site.wait(10)
            except subprocess.TimeoutExpired:
                site.kill()

    deadline = time.monotonic() + 30
    for address in hosts:
        while site_stats(address, args.port) is None:
            if time.monotonic() > deadline or any(site.poll() is not None for site in sites):
                stop_sites()
                raise SystemExit(f"site on {address}:{args.port} did not start")
            time.sleep(0.1)

    class Stats(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path != "/__stats":
                self.send_error(404)
                return
            body = json.dumps(summed_stats(hosts, args.port)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Stats)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"READY stats http://127.0.0.1:{args.port}/__stats sites {' '.join(hosts)} port {args.port}", flush=True)
    try:
        done.wait(args.max_seconds if args.max_seconds > 0 else None)
    finally:
        server.shutdown()
        stop_sites()


def main() -> None:
    ap = argparse.ArgumentParser(usage=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    hosts = sub.add_parser("hosts")
    hosts.add_argument("--count", type=int, default=8)
    hosts.add_argument("--shards", type=int, default=4)
    hosts.add_argument("--port", type=int, default=8893)
    run = sub.add_parser("serve")
    run.add_argument("--hosts-file", required=True)
    run.add_argument("--port", type=int, default=8893)
    run.add_argument("--harness", default=str(HERE.parent.parent / "shared" / "bench"))
    run.add_argument("--max-seconds", type=float, default=5400)
    run.add_argument("site_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    if args.command == "hosts":
        print("\n".join(pick_hosts(args.count, args.shards, args.port)))
    else:
        serve(args)


if __name__ == "__main__":
    main()
