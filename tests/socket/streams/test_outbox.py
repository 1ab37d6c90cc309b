"""The streams' outbox on both backends (a SQLite file, a real PostgreSQL database), as two
servers sharing one database see it: a stream is held by one server at a time and taken by
another when its lease runs out or is released; a delivery claimed by one is not tried by the
other until its claim runs out; an event is kept once per id; the streams file's streams
replace those of an earlier file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from server.streams.outbox import Outbox
from server.streams.outbox_factory import open_outbox
from tests.postgres_server import create_database, drop_database

pytestmark = pytest.mark.anyio

OpenOutbox = Callable[[], Awaitable[Outbox]]
SETTINGS = {"source": "file:///clip.mp4", "watches": [{"watch_id": "red", "condition": "Is it red?"}]}
HOOK = {"url": "http://127.0.0.1:9/hook"}


@pytest.fixture(params=["sqlite", "postgresql"])
async def open_outbox_of(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenOutbox]:
    """Opens outboxes of the test's backend on one fresh database; closes them and drops it after."""
    url = None
    admin_url = None
    if request.param == "postgresql":
        admin_url = request.getfixturevalue("postgres_url")
        url = await create_database(admin_url, "outbox")
    opened: list[Outbox] = []

    async def open_one() -> Outbox:
        outbox = open_outbox(url, tmp_path, max_events=3)
        await outbox.open()
        opened.append(outbox)
        return outbox

    yield open_one
    for outbox in opened:
        await outbox.close()
    if admin_url is not None and url is not None:
        await drop_database(admin_url, url)


async def test_a_stream_is_held_by_one_server_and_taken_by_another_when_its_lease_ends(
        open_outbox_of: OpenOutbox) -> None:
    """A stream is held by one server; another takes it when the lease runs out or is released,
    sees changes by revision, and takes no more than its room."""
    a, b = await open_outbox_of(), await open_outbox_of()
    assert await a.keep_stream("str_1", "owner", SETTINGS, "srv_a", lease_s=1.0) == 1
    await a.keep_stream("str_2", "owner", SETTINGS, None, lease_s=1.0)  # kept, held by nobody
    taken = await b.hold("srv_b", {}, room=5, lease_s=30.0)
    assert [k.stream_id for k in taken.taken] == ["str_2"] and taken.taken[0].settings == SETTINGS
    assert taken.next_expiry_s is not None and 0 < taken.next_expiry_s <= 1.0  # srv_a's lease of str_1
    held = await a.hold("srv_a", {"str_1": {"state": "live"}}, room=5, lease_s=1.0)
    assert held.revisions == {"str_1": 1} and held.taken == []
    listed = {k.stream_id: k for k in await b.kept_streams()}
    assert listed["str_1"].holder == "srv_a" and listed["str_1"].held and listed["str_1"].status == {"state": "live"}
    # a change from any server counts the revision up; the holder sees it at its next round
    assert await b.keep_stream("str_1", "owner", {**SETTINGS, "watches": []}, None, lease_s=1.0) == 2
    assert (await a.hold("srv_a", {"str_1": {"state": "live"}}, room=0, lease_s=1.0)).revisions == {"str_1": 2}
    await anyio.sleep(1.2)  # srv_a stops renewing: its lease runs out
    taken = await b.hold("srv_b", {"str_2": {}}, room=5, lease_s=30.0)
    assert [k.stream_id for k in taken.taken] == ["str_1"] and taken.taken[0].revision == 2
    assert (await a.hold("srv_a", {"str_1": {}}, room=0, lease_s=1.0)).revisions == {}  # lost
    # released leases are free at once; room bounds what a server takes
    await b.release("srv_b")
    assert len((await a.hold("srv_a", {}, room=1, lease_s=30.0)).taken) == 1
    assert len((await a.hold("srv_a", {}, room=1, lease_s=30.0)).taken) == 1
    assert (await b.hold("srv_b", {}, room=5, lease_s=30.0)).taken == []
    await b.forget("str_1")
    assert [k.stream_id for k in await a.kept_streams()] == ["str_2"]


async def test_a_claimed_delivery_is_tried_by_one_server_until_its_claim_ends(open_outbox_of: OpenOutbox) -> None:
    """A delivery claimed by one server is not due for the other until the claim ends; an event is
    kept once per id, with its evidence; a stream keeps its newest max_events."""
    a, b = await open_outbox_of(), await open_outbox_of()
    kept = await a.add("evt_1", "str_1", "watch.fired", 1000.0, {"watch_id": "red"}, [(999.0, b"jpeg")],
                       [("webhook", HOOK)])
    assert kept is not None
    assert await b.add("evt_1", "str_1", "watch.fired", 1000.0, {}, [], [("webhook", HOOK)]) is None  # once per id
    [delivery] = await a.due(2000.0, 10, claim_ms=5000.0)
    assert delivery.event.event_id == "evt_1" and delivery.target == HOOK and delivery.attempts == 0
    assert await b.due(2000.0, 10, claim_ms=5000.0) == []  # claimed by a
    assert await b.due(6999.0, 10, claim_ms=5000.0) == []
    [again] = await b.due(7001.0, 10, claim_ms=5000.0)  # a died while trying: b tries it
    await b.settle("evt_1", "webhook", "delivered", 7100.0)
    assert await a.due(1e15, 10, claim_ms=5000.0) == [] and await a.counts("str_1") == {"delivered": 1}
    assert await b.evidence("str_1", "evt_1", 0) == b"jpeg"
    for n in range(2, 6):  # a stream keeps its newest max_events (3) events
        await a.add(f"evt_{n}", "str_1", "watch.fired", 1000.0 + n, {}, [], [])
    assert [e.event_id for e in await b.after("str_1", 0)] == ["evt_3", "evt_4", "evt_5"]


async def test_the_streams_files_streams_replace_an_earlier_files(open_outbox_of: OpenOutbox) -> None:
    """A new streams file drops the streams of the earlier file it no longer names, not the API's."""
    a = await open_outbox_of()
    await a.keep_stream("str_api", "owner", SETTINGS, None, lease_s=1.0)
    await a.given_streams({"str_f1": SETTINGS, "str_f2": SETTINGS})
    await a.given_streams({"str_f2": SETTINGS, "str_f3": SETTINGS})
    kept = {k.stream_id: k for k in await a.kept_streams()}
    assert set(kept) == {"str_api", "str_f2", "str_f3"}
    assert kept["str_f2"].given and kept["str_f2"].owner == "" and not kept["str_api"].given


@pytest.mark.parametrize("open_outbox_of", ["postgresql"], indirect=True)  # SQLite: found at the keepalive
async def test_an_event_kept_by_one_server_wakes_the_others_readers(open_outbox_of: OpenOutbox) -> None:
    """PostgreSQL: an event one server keeps wakes the other's readers (SSE) through NOTIFY."""
    a, b = await open_outbox_of(), await open_outbox_of()
    added = b.added
    await a.add("evt_1", "str_1", "watch.fired", 1000.0, {}, [], [])
    with anyio.fail_after(5):
        await added.wait()
