"""Pagination stop rules and rate rescheduling, on responses made by a small stand-in API."""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest

from scrapekit.model import Request, Response
from scrapekit.paginate import CursorPaginator, MaxIdPaginator, NextLinkPaginator, PagePaginator, with_param
from scrapekit.reschedule import EveryRescheduler, RateRescheduler, ResourceState

URL = "http://api.example.org/timeline.json"


def timeline(ids: list[int], per_page: int, calls: list[str]):
    """A fetch for a timeline holding ``ids``: newest first, ``per_page`` below ``max_id``."""

    def fetch(request: Request) -> Response:
        calls.append(request.url)
        query = parse_qs(urlsplit(request.url).query)
        below = int(query["max_id"][0]) if "max_id" in query else None
        page = [i for i in sorted(ids, reverse=True) if below is None or i < below][:per_page]
        body = json.dumps({"items": [{"id": i} for i in page]}).encode()
        return Response(request, 200, "OK", {"content-type": "application/json"}, body)

    return fetch


def test_with_param_sets_one_parameter() -> None:
    assert with_param("http://h/x?a=1&max_id=5", "max_id", "3") == "http://h/x?a=1&max_id=3"
    assert with_param("http://h/x", "page", "2") == "http://h/x?page=2"


def test_max_id_walks_down_until_a_partial_page_then_stops_at_the_last_visits_high() -> None:
    calls: list[str] = []
    paginator = MaxIdPaginator(per_page=10, max_pages=50)
    state = ResourceState()
    responses, visit = paginator.visit(Request(URL), timeline(list(range(1, 36)), 10, calls), state, 1000.0)
    assert len(responses) == 4 and visit.stop == "partial page"
    assert [parse_qs(urlsplit(c).query).get("max_id") for c in calls] == [None, ["26"], ["16"], ["6"]]
    assert sorted(visit.ids) == list(range(1, 36))

    # The next visit: 12 new items; it stops as soon as it reaches id 35, seen last time.
    calls.clear()
    state.high = 35
    responses, visit = paginator.visit(Request(URL), timeline(list(range(1, 48)), 10, calls), state, 2000.0)
    assert visit.stop == "overlap" and len(responses) == 2


def test_max_pages_and_the_velocity_estimate_limit_the_pages_of_a_visit() -> None:
    calls: list[str] = []
    paginator = MaxIdPaginator(per_page=10, max_pages=3)
    responses, visit = paginator.visit(Request(URL), timeline(list(range(1, 500)), 10, calls), ResourceState(), 0.0)
    assert len(responses) == 3 and visit.stop == "max_pages"
    # 0.1 items/s for 150 s since the last visit: 15 expected, so 2 pages plus one to be sure.
    state = ResourceState(rate=0.1, visits=3, last_visit=1000.0)
    assert MaxIdPaginator(per_page=10, max_pages=15).wanted_pages(state, 1150.0) == 3
    assert MaxIdPaginator(per_page=10, max_pages=15).wanted_pages(state, 999.0) == 15  # clock went back


def test_stop_on_duplicate_stops_at_a_page_of_only_known_items() -> None:
    calls: list[str] = []
    state = ResourceState(high=1000)
    paginator = MaxIdPaginator(per_page=5, stop_on_duplicate=True)
    _, visit = paginator.visit(Request(URL), timeline(list(range(1, 100)), 5, calls), state, 0.0)
    assert visit.stop == "duplicate" and len(calls) == 1


def json_pages(pages: list[dict], headers_of=lambda n: {}):
    calls: list[str] = []

    def fetch(request: Request) -> Response:
        calls.append(request.url)
        query = parse_qs(urlsplit(request.url).query)
        n = int(query.get("page", ["1"])[0]) if "cursor" not in query else int(query["cursor"][0][1:])
        return Response(request, 200, "OK", headers_of(n), json.dumps(pages[n - 1]).encode())

    return fetch, calls


def test_page_numbers_stop_at_the_total_from_the_response() -> None:
    pages = [{"items": list(range(10)), "total": 30}] * 5
    fetch, calls = json_pages(pages)
    responses, visit = PagePaginator(per_page=10, total_path="$.total").visit(Request(URL), fetch, ResourceState(), 0)
    assert len(responses) == 3 and visit.stop == "last page"
    assert calls[-1].endswith("page=3")


def test_next_link_from_the_link_header_and_cursor_from_the_body() -> None:
    pages = [{"items": [1, 2]}, {"items": [3]}, {"items": [4]}]

    def headers_of(n: int) -> dict[str, str]:
        return {"link": f'<{URL}?page={n + 1}>; rel="next"'} if n < 3 else {}

    fetch, calls = json_pages(pages, headers_of)
    responses, visit = NextLinkPaginator().visit(Request(URL), fetch, ResourceState(), 0)
    assert len(responses) == 3 and visit.stop == "last page"

    cursors = [{"items": [1], "next_cursor": "c2"}, {"items": [2], "next_cursor": "c3"}, {"items": [3]}]
    fetch, calls = json_pages(cursors)
    responses, visit = CursorPaginator().visit(Request(URL), fetch, ResourceState(), 0)
    assert len(responses) == 3 and calls[1].endswith("cursor=c2") and visit.stop == "last page"


def test_a_broken_page_ends_the_visit_without_raising() -> None:
    def fetch(request: Request) -> Response:
        return Response(request, 200, "OK", {}, b"{not json")

    responses, visit = MaxIdPaginator(per_page=10).visit(Request(URL), fetch, ResourceState(), 0)
    assert len(responses) == 1 and visit.stop == "empty page"


def test_a_failed_page_ends_the_visit() -> None:
    def fetch(request: Request) -> Response:
        return Response(request, 503, "Unavailable", {}, b"", error="unavailable")

    responses, visit = MaxIdPaginator().visit(Request(URL), fetch, ResourceState(), 0)
    assert len(responses) == 1 and visit.stop == "error unavailable"


# -- rescheduling -------------------------------------------------------------------------------


def test_rate_rescheduling_rises_fully_falls_at_035_and_is_clamped(caplog: pytest.LogCaptureFixture) -> None:
    rescheduler = RateRescheduler(target_items=100, min_delay=5.0, max_delay=86_400.0)
    state = ResourceState()
    assert rescheduler.delay(state, 40, 1000.0, "r") == 5.0  # first visit: nothing to measure yet
    assert rescheduler.delay(state, 100, 1100.0, "r") == pytest.approx(100.0)  # 1 item/s, rising: fully
    assert state.rate == pytest.approx(1.0)
    wait = rescheduler.delay(state, 10, 1200.0, "r")  # 0.1/s observed: falls by 0.35 of the gap only
    assert state.rate == pytest.approx(1.0 + 0.35 * (0.1 - 1.0))
    assert wait == pytest.approx(100 / state.rate)
    assert state.items == 150 and state.visits == 3 and state.next_visit == pytest.approx(1200.0 + wait)
    with caplog.at_level(logging.INFO, logger="scrapekit"):
        rescheduler.delay(state, 0, 1300.0, "r")
    assert "resched r: 0 new items in 100s, rate" in caplog.text


def test_rates_far_below_one_item_per_second_give_long_delays_not_zero() -> None:
    rescheduler = RateRescheduler(target_items=10, min_delay=5.0, max_delay=86_400.0)
    state = ResourceState(rate=0.0, visits=1, last_visit=0.0)
    wait = rescheduler.delay(state, 2, 7200.0, "slow")  # 2 items in 2 h
    assert state.rate == pytest.approx(2 / 7200) and wait == pytest.approx(36_000.0)
    state = ResourceState(rate=0.0, visits=1, last_visit=0.0)
    assert rescheduler.delay(state, 1, 86_400.0 * 30, "rare") == 86_400.0  # clamped to max_delay


def test_a_clock_that_went_back_keeps_the_rate_and_still_reschedules(caplog: pytest.LogCaptureFixture) -> None:
    rescheduler = RateRescheduler(target_items=10)
    state = ResourceState(rate=0.5, visits=4, last_visit=5000.0)
    with caplog.at_level(logging.WARNING, logger="scrapekit"):
        wait = rescheduler.delay(state, 3, 4000.0, "r")
    assert state.rate == 0.5 and wait == pytest.approx(20.0) and "clock went back" in caplog.text


def test_every_and_the_state_round_trip() -> None:
    state = ResourceState(high=7, guids=["a", "b"])
    assert EveryRescheduler(60.0).delay(state, 2, 100.0, "x") == 60.0
    again = ResourceState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state and again.next_visit == 160.0
    assert ResourceState.from_dict({"rate": "fast"}) == ResourceState()  # unreadable: start afresh


def test_a_resource_with_nothing_new_backs_off_twice_as_long_each_visit() -> None:
    rescheduler = RateRescheduler(target_items=10, min_delay=5.0, max_delay=60.0)
    state = ResourceState()
    waits = [rescheduler.delay(state, 0, t, "quiet") for t in (0.0, 5.0, 15.0, 35.0, 75.0, 135.0)]
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
