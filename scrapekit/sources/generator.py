"""The generator source: one request per code of a range, for URL-shortener style scrapes.

Codes are numerals in base 36 or base 62, taken in order or in a keyed random order that is a
true permutation of the range (``FeistelPermutation``); the saved position is a step count, so
a run resumes in either order with no memory proportional to the range.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from typing import Literal

from ..errors import ScrapekitError
from ..model import KINDS, BadUrl, Request, canonical_url
from .flatfile import Kind

Alphabet = Literal["base36", "base62"]
Order = Literal["sequential", "random"]

ALPHABETS: dict[str, str] = {
    "base36": string.digits + string.ascii_lowercase,
    "base62": string.digits + string.ascii_uppercase + string.ascii_lowercase,
}
"""Digits of each alphabet, lowest first. In ASCII order, so codes of one length sort as their values."""

_DIGITS_SHOWN = {"base36": "0-9 a-z", "base62": "0-9 A-Z a-z"}

ORDERS = ("sequential", "random")
PLACEHOLDER = "{code}"

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: spreads consecutive round numbers apart
_ROUNDS = 4  # Luby-Rackoff: four rounds of a good mixing function make a well-shuffled permutation


def _mix64(value: int) -> int:
    """The splitmix64 finaliser: every input bit flips about half the output bits."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK64
    return value ^ (value >> 31)


class FeistelPermutation:
    """A keyed permutation of ``range(size)`` computed one index at a time, in constant memory.

    A balanced Feistel network shuffles the numbers of ``2h`` bits, the fewest even number of
    bits that holds every index (so fewer than ``4 * size`` numbers): each round maps the halves
    ``(left, right)`` to ``(right, left ^ F(right))``, which is invertible whatever ``F`` is, so
    the network is a bijection. ``F`` is splitmix64 of the half xor a round key drawn from
    ``seed``. Cycle-walking keeps the result inside the range: an output at or past ``size`` is
    fed through the network again until it lands inside, which restricts the bijection of the
    ``2h``-bit numbers to one of ``range(size)`` (fewer than 4 passes are expected).
    Not cryptographic: the order is unpredictable to a server, not to an attacker.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        if size < 0:
            raise ValueError(f"a permutation needs a size of 0 or more, got {size}")
        self.size = size
        half = max(1, ((size - 1).bit_length() + 1) // 2)
        self._half = half
        self._mask = (1 << half) - 1
        self._keys = [_mix64((seed * _ROUNDS + r + 1) * _GOLDEN & _MASK64) for r in range(_ROUNDS)]

    def __call__(self, index: int) -> int:
        """The index that ``index`` moves to, in ``range(size)``."""
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} is outside range({self.size})")
        value = self._shuffle(index)
        while value >= self.size:
            value = self._shuffle(value)
        return value

    def _shuffle(self, value: int) -> int:
        half, mask = self._half, self._mask
        left, right = value >> half, value & mask
        for key in self._keys:
            left, right = right, left ^ (_mix64(right ^ key) & mask)
        return (left << half) | right


def code_value(code: str, alphabet: Alphabet) -> int:
    """The number ``code`` writes in ``alphabet``; ValueError for an empty code or a foreign character."""
    digits = ALPHABETS[alphabet]
    if not code:
        raise ValueError("a code cannot be empty")
    value = 0
    for char in code:
        digit = digits.find(char)
        if digit < 0:
            raise ValueError(f"code {code!r} has {char!r}, which is not a {alphabet} digit ({_DIGITS_SHOWN[alphabet]})")
        value = value * len(digits) + digit
    return value


def format_code(value: int, alphabet: Alphabet, width: int = 1) -> str:
    """``value`` written in ``alphabet``, left-padded with the zero digit to ``width`` characters."""
    digits = ALPHABETS[alphabet]
    base = len(digits)
    chars = []
    while True:
        value, digit = divmod(value, base)
        chars.append(digits[digit])
        if not value:
            break
    return "".join(reversed(chars)).rjust(width, digits[0])


class GeneratorSource:
    """One request per code of a range, at ``template`` with ``{code}`` replaced by the code.

    The range is ``[start, stop)``, two codes of ``alphabet`` compared by value (codes are
    numbers: base 36 digits are 0-9a-z, base 62 digits 0-9A-Za-z, and ``10`` follows ``z``); each
    code is padded with the zero digit to the length of ``start``, so ``start: "000"`` keeps
    every code three characters long. ``length`` instead takes every code of exactly that length.
    Quote codes in YAML: ``010`` unquoted is the number 8.

    ``order: random`` takes the range in the order of ``FeistelPermutation`` keyed by ``seed``:
    every code once, the same order for the same seed. With ``shards`` workers, worker ``shard``
    takes the codes whose index in the range (0 for ``start``) is ``shard`` modulo ``shards``,
    so workers with equal options but their shard split the range with no overlap.

    Requests have ``kind`` and are keyed by their canonical URL (model.canonical_url), as a
    flat-file seed is. The position is the number of this shard's codes yielded so far; ``count``
    is how many it yields in all.
    """

    def __init__(self, template: str, alphabet: Alphabet = "base62", start: str | None = None,
                 stop: str | None = None, length: int | None = None, order: Order = "sequential",
                 seed: int = 0, kind: Kind = "head", shard: int = 0, shards: int = 1) -> None:
        if alphabet not in ALPHABETS:
            raise ValueError(f"alphabet must be one of {', '.join(ALPHABETS)}, got {alphabet!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if shards < 1 or not 0 <= shard < shards:
            raise ValueError(f"shard must be from 0 to shards - 1 and shards 1 or more, got shard {shard} of {shards}")
        self.template = template
        self.alphabet: Alphabet = alphabet
        self.order: Order = order
        self.kind: Kind = kind
        self.shard = shard
        self.shards = shards
        self.first, self.stop, self.width = _bounds(alphabet, start, stop, length)
        _check_template(template, ALPHABETS[alphabet])
        self.count = len(range(shard, self.stop - self.first, shards))
        self._permutation = FeistelPermutation(self.count, seed) if order == "random" else None

    def codes(self, position: int = 0) -> Iterator[str]:
        """This shard's codes in order, from the ``position``-th (0: the first) to the last."""
        for step in range(position, self.count):
            index = step if self._permutation is None else self._permutation(step)
            yield format_code(self.first + self.shard + index * self.shards, self.alphabet, self.width)

    def requests(self, position: str | None) -> Iterator[tuple[Request, str]]:
        """A request per code from ``position`` on, each with the position after it."""
        step = _step(position, self.count)
        for step, code in enumerate(self.codes(step), step + 1):
            yield Request(url=self.template.replace(PLACEHOLDER, code), kind=self.kind), str(step)


def _bounds(alphabet: Alphabet, start: str | None, stop: str | None, length: int | None) -> tuple[int, int, int]:
    """The range's first value, its stop value and the width codes are padded to."""
    if length is not None:
        if start is not None or stop is not None:
            raise ValueError("give either length or start and stop, not both")
        if length < 1:
            raise ValueError(f"length must be 1 or more, got {length}")
        return 0, len(ALPHABETS[alphabet]) ** length, length
    if start is None or stop is None:
        raise ValueError("give start and stop (codes; stop is excluded), or length (every code of that length)")
    first, last = code_value(start, alphabet), code_value(stop, alphabet)
    if first >= last:
        raise ValueError(f"start {start!r} must come before stop {stop!r} (in {alphabet}, {start!r} is {first} "
                         f"and {stop!r} is {last})")
    return first, last, len(start)


def _check_template(template: str, digits: str) -> None:
    """ValueError unless ``template`` gives an http(s) URL with a distinct key for every code."""
    if PLACEHOLDER not in template:
        raise ValueError(f"template must contain {PLACEHOLDER}, e.g. http://example.com/s/{PLACEHOLDER}")
    # One key per single-digit code shows that no code loses its identity: a code in the host
    # name loses its case, one in a session parameter is dropped altogether.
    try:
        keys = {canonical_url(template.replace(PLACEHOLDER, digit)) for digit in digits}
    except BadUrl as exc:
        raise ValueError(f"template {template!r} does not give a URL to fetch: {exc}") from None
    if len(keys) < len(digits):
        raise ValueError(f"template {template!r} gives the same URL key for different codes "
                         f"(is {PLACEHOLDER} in the host name, where case is lost, or in a session parameter?)")


def _step(position: str | None, count: int) -> int:
    if position is None:
        return 0
    if not position.isdigit() or int(position) > count:
        raise ScrapekitError(f"generator source: saved position {position!r} is not a step from 0 to {count}")
    return int(position)
