"""Optional statsd output (``log.statsd: host:port``): the run's counters as statsd counters
(``scrapekit.<name>.done:3|c``, the increase since the last send) and its rate, queue and
bandwidth as gauges, one UDP datagram per send. UDP: a missing listener costs nothing and
never slows or stops a run."""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from typing import Any

from .stats import TOTALS

log = logging.getLogger(__name__)

_MAX_DATAGRAM = 1400  # stay inside one Ethernet frame


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError for anything else."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port like 127.0.0.1:8125, got {text!r}")
    return host, int(port)


class StatsdSender:
    """Sends a snapshot's changes since the previous one to a statsd server."""

    def __init__(self, address: tuple[str, int], name: str) -> None:
        self.address = address
        self.prefix = f"scrapekit.{name}."
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._last: dict[str, int] = {}

    def send(self, snapshot: Mapping[str, Any]) -> None:
        lines = []
        for name in TOTALS:
            value = int(snapshot.get(name, 0) or 0)
            delta = value - self._last.get(name, value)
            self._last[name] = value
            if delta > 0:
                lines.append(f"{self.prefix}{name}:{delta}|c")
        lines.append(f"{self.prefix}rate:{float(snapshot.get('rate', 0.0)):.2f}|g")
        for state, count in (snapshot.get("queue") or {}).items():
            lines.append(f"{self.prefix}queue.{state}:{int(count)}|g")
        bandwidth = snapshot.get("bandwidth") or {}
        if "day_bytes" in bandwidth:
            lines.append(f"{self.prefix}bandwidth.day_bytes:{int(bandwidth['day_bytes'])}|g")
        datagram = ""
        for line in lines:
            if datagram and len(datagram) + len(line) + 1 > _MAX_DATAGRAM:
                self._send(datagram)
                datagram = ""
            datagram = f"{datagram}\n{line}" if datagram else line
        if datagram:
            self._send(datagram)

    def _send(self, datagram: str) -> None:
        try:
            self._sock.sendto(datagram.encode("ascii", "replace"), self.address)
        except OSError as exc:  # unresolvable host, no route: statsd is best effort
            log.debug("statsd: %s", exc)

    def close(self) -> None:
        self._sock.close()
