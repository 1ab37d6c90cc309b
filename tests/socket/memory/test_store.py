"""The session memory store (server/memory), each test run on SQLite and on a real PostgreSQL server:
the timeline of moments, text search, limits, clearing, resume handles, and many writes from one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from server.memory.factory import open_store
from server.memory.postgres_store import PostgresMemoryStore
from server.memory.sqlite_store import SqliteMemoryStore
from server.memory.store import MAX_HANDLES_PER_SESSION, MemoryLimits, MemoryStore
from tests.postgres_server import create_database, drop_database
from tests.sqlite_bytes import bytes_on_disk

pytestmark = pytest.mark.anyio

T0 = 1_750_000_000_000.0  # a wall-clock time in ms
ROOMY = MemoryLimits(max_age_s=3600, max_session_bytes=10**9, max_bytes=10**10)

OpenMemory = Callable[..., Awaitable[MemoryStore]]


def jpeg(label: str, size: int = 1000) -> bytes:
    """A JPEG-shaped blob of ``size`` bytes carrying ``label``."""
    body = (label.encode() * size)[: size - 4]
    return b"\xff\xd8" + body + b"\xff\xd9"


@pytest.fixture(params=["sqlite", "postgresql"])
async def open_memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenMemory]:
    """Opens stores of the test's backend on one fresh database (a new file, or a new PostgreSQL
    database), closes them and drops the database after the test."""
    url = None
    admin_url = None
    if request.param == "postgresql":
        admin_url = request.getfixturevalue("postgres_url")
        url = await create_database(admin_url, "memory")
    stores: list[MemoryStore] = []

    async def open_one(limits: MemoryLimits = ROOMY) -> MemoryStore:
        store = open_store(url, tmp_path, limits)
        await store.open()
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        await store.close()
    if admin_url is not None and url is not None:
        await drop_database(admin_url, url)


@pytest.fixture
async def store(open_memory: OpenMemory) -> MemoryStore:
    """An open store with limits nothing in a test reaches."""
    return await open_memory()


async def test_each_moment_ends_where_the_next_starts(store: MemoryStore) -> None:
    """A new moment ends the one before it; the newest ends at its own start."""
    first = await store.add_moment("s", T0, jpeg("a"))
    assert (first.start_ms, first.end_ms) == (T0, T0)
    await store.add_moment("s", T0 + 1000, jpeg("b"))
    await store.add_moment("s", T0 + 3000, jpeg("c"))
    late = await store.add_moment("s", T0 + 2000, jpeg("d"))  # a clock that stepped back
    assert late.end_ms == T0 + 3000
    spans = [(m.start_ms - T0, m.end_ms - T0) for m in await store.moments("s")]
    assert spans == [(0, 1000), (1000, 2000), (2000, 3000), (3000, 3000)]
    assert await store.moments("other") == []


async def test_a_range_holds_the_moment_current_at_its_start(store: MemoryStore) -> None:
    """A range returns the moment current at its start and those starting within it, oldest first."""
    for i in range(4):
        await store.add_moment("s", T0 + i * 1000, jpeg(str(i)))

    async def starts(from_ms: float | None, to_ms: float | None, limit: int = 1000) -> list[float]:
        return [m.start_ms - T0 for m in await store.moments("s", from_ms, to_ms, limit)]

    assert await starts(T0 + 1500, T0 + 2500) == [1000, 2000]
    assert await starts(T0 + 1000, T0 + 1000) == [1000]
    assert await starts(T0 + 9000, None) == [3000]  # the newest lasts until a next one
    assert await starts(None, T0 - 1) == []
    assert await starts(None, None, limit=2) == [0, 1000]
    assert len(await store.moments("s", limit=10**9)) == 4


async def test_spread_picks_evenly_with_the_first_and_the_last(store: MemoryStore) -> None:
    """spread returns at most n moments with their JPEGs, evenly over the range, its ends included."""
    blobs = {}
    for i in range(10):
        blobs[i * 1000.0] = jpeg(f"frame{i}")
        await store.add_moment("s", T0 + i * 1000, blobs[i * 1000.0])

    async def starts(from_ms: float, to_ms: float, n: int) -> list[float]:
        picked = await store.spread("s", T0 + from_ms, T0 + to_ms, n)
        assert all(data == blobs[m.start_ms - T0] for m, data in picked)
        return [m.start_ms - T0 for m, _ in picked]

    assert await starts(0, 9000, 4) == [0, 3000, 6000, 9000]
    assert await starts(0, 9000, 2) == [0, 9000]
    assert await starts(500, 8500, 3) == [0, 4000, 8000]
    assert await starts(0, 9000, 1) == [4000]
    assert await starts(0, 9000, 100) == [i * 1000 for i in range(10)]
    assert await starts(0, 9000, 0) == []
    assert await starts(9000, 0, 3) == []
    assert await starts(-5000, 1500, 3) == [0, 1000]  # before the first moment: the first one


async def test_a_jpeg_comes_back_byte_for_byte_to_its_session_only(store: MemoryStore) -> None:
    """jpeg returns the stored bytes, and None for another session's moment or an unknown one."""
    blob = bytes(range(256)) * 300
    moment = await store.add_moment("s", T0, blob)
    assert moment.jpeg_bytes == len(blob)
    assert await store.jpeg("s", moment.moment_id) == blob
    assert await store.jpeg("other", moment.moment_id) is None
    assert await store.jpeg("s", moment.moment_id + 1000) is None


async def test_a_note_belongs_to_the_moment_current_at_its_time(store: MemoryStore) -> None:
    """A note points at the newest moment started by its time, or none, even when a moment comes late."""
    before = await store.add_note("s", "transcript", T0 - 10, "too early")
    assert before.moment_id is None
    first = await store.add_moment("s", T0, jpeg("a"))
    note = await store.add_note("s", "question", T0 + 2500, "what is that?")
    assert note.moment_id == first.moment_id
    late = await store.add_moment("s", T0 + 2000, jpeg("b"))
    assert [(n.text, n.moment_id) for n in await store.notes("s")] == [
        ("too early", None), ("what is that?", late.moment_id)]
    assert [n.kind for n in await store.notes("s", T0, None)] == ["question"]
    with pytest.raises(ValueError):
        await store.add_note("s", "shout", T0, "no such kind")
    with pytest.raises(ValueError):
        await store.add_moment("x" * 129, T0, jpeg("a"))
    with pytest.raises(ValueError):
        await store.add_note("s\x00", "answer", T0, "no NUL in a session id")
    nul = await store.add_note("s", "answer", T0 + 3000, "a\x00b")
    assert nul.text == "a\ufffdb" and (await store.notes("s", T0 + 3000))[0].text == "a\ufffdb"


async def test_search_finds_notes_and_captions_newest_first(store: MemoryStore) -> None:
    """A word finds captions and notes holding it (every word of the query), newest first, with their moment."""
    kitchen = await store.add_moment("s", T0, jpeg("a"))
    await store.set_caption("s", kitchen.moment_id, "A red kettle on the stove")
    hall = await store.add_moment("s", T0 + 1000, jpeg("b"))
    await store.add_note("s", "transcript", T0 + 1500, "where did I leave the Kettle")
    await store.add_note("s", "answer", T0 + 1600, "the keys are on the table")
    await store.add_note("other", "transcript", T0 + 1500, "kettle of another session")

    hits = await store.search_text("s", "kettle")
    assert [(h.kind, h.at_ms - T0) for h in hits] == [("transcript", 1500), ("caption", 0)]
    assert hits[0].moment is not None and hits[0].moment.moment_id == hall.moment_id
    assert hits[1].moment is not None and hits[1].moment.caption == "A red kettle on the stove"
    assert [h.text for h in await store.search_text("s", "red kettle")] == ["A red kettle on the stove"]
    assert await store.search_text("s", "kettle", limit=1) == hits[:1]
    await store.set_caption("s", kitchen.moment_id, "an empty stove")
    assert [h.kind for h in await store.search_text("s", "kettle")] == ["transcript"]


async def test_search_keeps_to_the_range(store: MemoryStore) -> None:
    """Only notes timed in the range, and captions of moments in it, are found."""
    for i in range(3):
        moment = await store.add_moment("s", T0 + i * 1000, jpeg(str(i)))
        await store.set_caption("s", moment.moment_id, f"a dog in frame {i}")
        await store.add_note("s", "fire", T0 + i * 1000 + 500, f"dog alert {i}")

    hits = await store.search_text("s", "dog", T0 + 1200, T0 + 1800)
    assert [h.text for h in hits] == ["dog alert 1", "a dog in frame 1"]
    assert [h.text for h in await store.search_text("s", "dog", None, T0 + 100)] == ["a dog in frame 0"]


@pytest.mark.parametrize("query", ['"', "AND (", "*", "NEAR(", "dog OR", "-dog", "a:b", "'; DROP TABLE notes; --",
                                   "ÉTÉ 東京 🐕", "_", "", "   ", "\x00", "(" * 50, "x " * 500])
async def test_hostile_queries_never_raise(store: MemoryStore, query: str) -> None:
    """Query syntax, quotes, unicode, NUL, empty and long texts are plain words: a list, never an error."""
    moment = await store.add_moment("s", T0, jpeg("a"))
    await store.set_caption("s", moment.moment_id, "été à Tōkyō 東京 with a dog")
    hits = await store.search_text("s", query)
    assert isinstance(hits, list)


async def test_the_session_limit_deletes_its_oldest_moments_with_their_notes(open_memory: OpenMemory) -> None:
    """Past a session's byte limit its oldest moments and their notes go; other sessions stay."""
    store = await open_memory(MemoryLimits(max_age_s=3600, max_session_bytes=3500, max_bytes=10**9))
    await store.add_moment("other", T0, jpeg("o"))
    for i in range(5):
        await store.add_moment("s", T0 + i * 1000, jpeg(str(i)))
        await store.add_note("s", "transcript", T0 + i * 1000 + 1, f"said {i}")
    assert [m.start_ms - T0 for m in await store.moments("s")] == [2000, 3000, 4000]
    assert [n.text for n in await store.notes("s")] == ["said 2", "said 3", "said 4"]
    assert await store.usage("s") == 3000 + 3 * len("said 0") <= 3500
    assert await store.usage("other") == 1000
    assert await store.usage() == await store.usage("s") + 1000


async def test_the_store_limit_deletes_the_oldest_moments_of_any_session(open_memory: OpenMemory) -> None:
    """Past the whole store's byte limit the oldest moments go, whichever session they belong to."""
    store = await open_memory(MemoryLimits(max_age_s=3600, max_session_bytes=10**9, max_bytes=4000))
    for i in range(6):
        await store.add_moment("ab"[i % 2], T0 + i * 1000, jpeg(str(i)))
    assert [m.start_ms - T0 for m in await store.moments("a")] == [2000, 4000]
    assert [m.start_ms - T0 for m in await store.moments("b")] == [3000, 5000]
    assert await store.usage() == 4000
    big = await store.add_moment("c", T0 + 9000, jpeg("big", 5000))  # alone over the limit: kept
    assert await store.jpeg("c", big.moment_id) is not None
    assert not await store.has("a") and not await store.has("b")


async def test_sweep_deletes_what_is_older_than_the_age_limit(open_memory: OpenMemory) -> None:
    """sweep deletes moments that ended and notes made before now - max_age_s, and says how many."""
    store = await open_memory(MemoryLimits(max_age_s=10, max_session_bytes=10**9, max_bytes=10**9))
    for i in range(4):
        await store.add_moment("s", T0 + i * 5000, jpeg(str(i)))
        await store.add_note("s", "caption", T0 + i * 5000 + 1, f"seen {i}")
    await store.add_moment("idle", T0, jpeg("idle"))
    assert await store.sweep(T0 + 21_000) == 2 + 3 + 1  # the moment of 10 s to 15 s ended after the cutoff
    assert [m.start_ms - T0 for m in await store.moments("s")] == [10_000, 15_000]
    assert [n.text for n in await store.notes("s")] == ["seen 3"]
    assert not await store.has("idle") and await store.usage("idle") == 0
    assert await store.sweep(T0 + 21_000) == 0


async def test_clear_deletes_the_whole_session(store: MemoryStore) -> None:
    """clear deletes every moment and note of the session, says how many, and leaves others alone."""
    for i in range(3):
        moment = await store.add_moment("s", T0 + i, jpeg(str(i)))
        await store.set_caption("s", moment.moment_id, "a cat")
    await store.add_note("s", "question", T0 + 5, "is there a cat?")
    await store.add_moment("other", T0, jpeg("o"))
    assert await store.has("s")
    assert await store.clear("s") == 4
    assert not await store.has("s") and await store.usage("s") == 0
    assert await store.moments("s") == [] and await store.notes("s") == []
    assert await store.search_text("s", "cat") == []
    assert await store.has("other") and await store.usage() == 1000
    assert await store.clear("s") == 0


async def test_cleared_bytes_are_gone_from_the_sqlite_files(tmp_path: Path) -> None:
    """After clear, a cleared JPEG's bytes and a note's words are in neither the SQLite file nor its WAL."""
    store = open_store(None, tmp_path, ROOMY)
    assert isinstance(store, SqliteMemoryStore)
    secret = b"ZQX-SECRET-FRAME-"
    word = "xylophonequartzite"

    def on_disk() -> bytes:
        return bytes_on_disk(Path(store.path))

    await store.open()
    try:
        with contextlib.closing(sqlite3.connect(store.path)) as other:  # WAL is a property of the file
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        for i in range(5):
            await store.add_moment("s", T0 + i, jpeg(secret.decode(), 20_000))
            await store.add_note("s", "transcript", T0 + i, f"the word is {word}")
        await store.add_moment("kept", T0, jpeg("kept"))
        assert secret in on_disk() and word.encode() in on_disk()
        await store.clear("s")
        assert secret not in on_disk() and word.encode() not in on_disk()
        assert await store.has("kept")
    finally:
        await store.close()


async def test_concurrent_writes_all_land_without_blocking_the_event_loop(store: MemoryStore) -> None:
    """200 add_moment calls at once all land, chained in time order, while the event loop keeps ticking
    between them (a store working on the loop would finish them all within one tick)."""
    ticks = 0
    gaps: list[float] = []
    ticks_at_each_write: list[int] = []
    done = anyio.Event()

    async def tick() -> None:
        nonlocal ticks
        last = time.perf_counter()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            ticks, last = ticks + 1, now

    async def write(i: int) -> None:
        await store.add_moment("s", T0 + i * 10, jpeg(str(i), 50_000))
        ticks_at_each_write.append(ticks)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        async with anyio.create_task_group() as writers:
            for i in range(200):
                writers.start_soon(write, i)
        done.set()
    total = time.perf_counter() - started

    moments = await store.moments("s")
    assert [m.start_ms - T0 for m in moments] == [i * 10 for i in range(200)]
    assert [m.end_ms for m in moments[:-1]] == [m.start_ms for m in moments[1:]]
    assert len(set(ticks_at_each_write)) >= 10 and max(gaps) < total / 2


async def test_clears_among_concurrent_writes_never_fail(store: MemoryStore) -> None:
    """Clearing a session while its moments and notes are being written fails no write."""
    async with anyio.create_task_group() as tg:
        for i in range(60):
            tg.start_soon(store.add_moment, "s", T0 + i, jpeg(str(i)))
            tg.start_soon(store.add_note, "s", "transcript", T0 + i, f"word {i}")
            if i % 10 == 5:
                tg.start_soon(store.clear, "s")
    await store.add_note("s", "answer", T0 + 100, "after")
    assert (await store.notes("s"))[-1].text == "after"


async def test_two_stores_open_the_same_database_at_once(open_memory: OpenMemory) -> None:
    """Two processes' stores may create the schema at the same time; both then see the same data."""
    async with anyio.create_task_group() as tg:
        opened: list[MemoryStore] = []

        async def open_into() -> None:
            opened.append(await open_memory())

        tg.start_soon(open_into)
        tg.start_soon(open_into)
    first, second = opened
    moment = await first.add_moment("s", T0, jpeg("a"))
    assert [m.moment_id for m in await second.moments("s")] == [moment.moment_id]


async def test_the_url_names_the_backend(tmp_path: Path) -> None:
    """No URL or sqlite:// gives SQLite (default file, absolute or data-dir-relative path); postgres URLs
    give PostgreSQL; anything else is refused with the accepted forms."""
    def sqlite_path(url: str | None) -> Path:
        store = open_store(url, tmp_path, ROOMY)
        assert isinstance(store, SqliteMemoryStore) and store.backend == "sqlite"
        return store.path

    assert sqlite_path(None) == tmp_path / "memory.sqlite3"
    assert sqlite_path("sqlite://") == tmp_path / "memory.sqlite3"
    assert sqlite_path(" ") == tmp_path / "memory.sqlite3"  # an empty setting (a compose file's unset variable)
    assert sqlite_path("sqlite:///var/lib/m.db") == Path("/var/lib/m.db")
    assert sqlite_path("sqlite://sub/m.db") == tmp_path / "sub" / "m.db"
    for url in ("postgresql://u@h/db", "postgres://u@h:5/db"):
        store = open_store(url, tmp_path, ROOMY)
        assert isinstance(store, PostgresMemoryStore) and store.backend == "postgresql"
    for url in ("mysql://u@h/db", "memory.db"):
        with pytest.raises(ValueError, match="sqlite://"):
            open_store(url, tmp_path, ROOMY)


async def test_a_kept_handle_resumes_its_session_once(store: MemoryStore) -> None:
    """take_handle gives the session a handle was kept for, once; an unknown handle gives None."""
    await store.keep_handle("h1", "s", "key-a", T0)
    await store.keep_handle("h2", "other", "", T0)
    assert await store.take_handle("h1", "key-a") == "s"
    assert await store.take_handle("h1", "key-a") is None
    assert await store.take_handle("h2", "") == "other"
    assert await store.take_handle("never", "") is None
    assert await store.take_handle("x" * 200, "") is None and await store.take_handle("h\x00", "") is None
    await store.keep_handle("h3", "s", "key-a", T0)
    await store.keep_handle("h3", "t", "key-b", T0 + 1)  # the same handle again replaces the row
    assert await store.take_handle("h3", "key-a") is None
    assert await store.take_handle("h3", "key-b") == "t"
    with pytest.raises(ValueError):
        await store.keep_handle("", "s", "", T0)
    with pytest.raises(ValueError):
        await store.keep_handle("x" * 129, "s", "", T0)


async def test_a_handle_taken_by_another_owner_stays_for_its_own(store: MemoryStore) -> None:
    """A wrong owner (another key, or none) gets None and leaves the handle working for its owner."""
    await store.keep_handle("h", "s", "key-a", T0)
    assert await store.take_handle("h", "key-b") is None
    assert await store.take_handle("h", "") is None
    assert await store.take_handle("h", "key-a") == "s"


async def test_clear_deletes_the_handles_and_the_limits_do_not(open_memory: OpenMemory) -> None:
    """clear deletes the session's handles (and no other's); the byte limit deleting its moments keeps them."""
    store = await open_memory(MemoryLimits(max_age_s=3600, max_session_bytes=1500, max_bytes=10**9))
    await store.keep_handle("h1", "s", "", T0)
    await store.keep_handle("h2", "s", "", T0)
    await store.keep_handle("o", "other", "", T0)
    for i in range(3):
        await store.add_moment("s", T0 + i, jpeg(str(i)))
    assert len(await store.moments("s")) == 1 and await store.usage("s") == 1000
    assert await store.take_handle("h1", "") == "s"
    assert await store.clear("s") == 1
    assert await store.take_handle("h2", "") is None
    assert await store.take_handle("o", "") == "other"


async def test_sweep_deletes_old_handles(open_memory: OpenMemory) -> None:
    """sweep deletes handles kept before now - max_age_s without counting them; a younger one stays even
    when its session has nothing else left."""
    store = await open_memory(MemoryLimits(max_age_s=10, max_session_bytes=10**9, max_bytes=10**9))
    await store.add_note("s", "answer", T0, "said")
    await store.keep_handle("old", "s", "", T0)
    await store.keep_handle("young", "s", "", T0 + 15_000)
    assert await store.sweep(T0 + 21_000) == 1
    assert not await store.has("s")
    assert await store.take_handle("old", "") is None
    assert await store.take_handle("young", "") == "s"


async def test_a_session_keeps_its_newest_handles(store: MemoryStore) -> None:
    """Keeping one handle more than MAX_HANDLES_PER_SESSION deletes the session's oldest, not other sessions'."""
    await store.keep_handle("other", "o", "", T0 - 1)
    for i in range(MAX_HANDLES_PER_SESSION + 1):
        await store.keep_handle(f"h{i}", "s", "", T0 + i)
    taken = [await store.take_handle(f"h{i}", "") for i in range(MAX_HANDLES_PER_SESSION + 1)]
    assert taken == [None] + ["s"] * MAX_HANDLES_PER_SESSION
    assert await store.take_handle("other", "") == "o"


async def test_concurrent_takes_of_one_handle_resume_once(open_memory: OpenMemory) -> None:
    """Takes of one handle at once, through one store or two sharing the database, give the session to one."""
    first = await open_memory()
    second = await open_memory()
    for i in range(5):
        await first.keep_handle(f"h{i}", "s", "key", T0)
        taken = await asyncio.gather(*(store.take_handle(f"h{i}", "key") for store in (first, second) * 2))
        assert sorted(taken, key=str) == [None, None, None, "s"]


async def test_the_first_claim_owns_a_session_until_it_is_cleared_or_swept(open_memory: OpenMemory) -> None:
    """claim records the session's owner once (a second claim changes nothing); clear forgets it;
    sweep forgets an old claim only once the session holds nothing."""
    store = await open_memory(MemoryLimits(max_age_s=10, max_session_bytes=10**9, max_bytes=10**9))
    assert await store.owner("s") is None
    await store.claim("s", "alice", T0)
    await store.claim("s", "mallory", T0 + 1)
    assert await store.owner("s") == "alice"
    await store.add_moment("s", T0 + 20_000, jpeg("kept"))
    await store.claim("idle", "bob", T0)
    await store.sweep(T0 + 30_000)
    assert await store.owner("s") == "alice" and await store.owner("idle") is None
    await store.clear("s")
    assert await store.owner("s") is None
    with pytest.raises(ValueError):
        await store.claim("s", "x" * 10_000, T0)
