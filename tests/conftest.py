"""The suite's tiers and what every test shares; nothing heavy is imported here.

A test's folder is its tier: the first folder under tests/ names it, never a marker in the file.

    core     pure code driven by calls and events: no socket, no engine, no torch, seconds
    session  the session adapter with a scripted engine over an in-memory transport
    socket   the real app over a real socket on port 0, or the real engine (torch, a
             generated tiny model, a `livesight serve` child)
    heavy    vLLM, Chromium, Debian tools (docker-compose, unshare), load and fuzz runs,
             anything over ~20 s

Under a tier, folders mirror the source (tests/heavy/engines tests server/engines on vLLM,
tests/socket/realtime handlers/realtime through the real app); a tier's namesake sits at its root
(tests/core/test_*.py test handlers/core, tests/session/test_*.py the session adapter). A test
that needs more than its folder's tier moves to that tier's folder of the same area.

``pytest -m core`` (``make test-core``) imports no torch and generates no model: the files of
other tiers are not even imported when ``-m`` names only tiers, and a run of only core and
session tests fails if torch was loaded. The real-server fixtures live in tests/real_server.py.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# No load shedding in the suite's servers (in-process and `livesight serve` children alike): the
# suite shares two cores with Chromium and vLLM, and a frame shed there makes exact frame counts
# flaky. Shedding is pinned by tests that set intake_max_wait_ms themselves (test_settings_wiring)
# and by the read-ahead budgets (test_intake_faults), which this does not touch.
os.environ.setdefault("LIVESIGHT_INTAKE_MAX_WAIT_MS", "60000")

# `make test` runs the suite in two worker processes (pytest-xdist: ``-n 2``)
# on the machine's two cores, so every process of the run computes on one OpenMP thread, unbound:
# two threads on two busy cores spin instead of working, and vLLM on a CPU binds its worker to
# core 0 unless told not to (every vLLM of the run would share one core).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
# Every vLLM of the run (in a livesight process or `vllm serve`) runs its model in its engine-core
# process instead of a worker process of its own: one Python (torch, vLLM) fewer to start each
# time, ~10 s of a tiny model's ~35 s start on an idle 2-core machine. The engine is the same;
# production keeps vLLM's default.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

pytest_plugins = ("tests.real_server", "tests.colours_models", "tests.vllm_servers", "tests.postgres_server")

#: The run's own temporary directory, removed when the run ends: every temporary file of the run
#: goes there (pytest's tmp_path, and through TMPDIR what the servers, vLLM's IPC sockets and
#: compile caches, Chromium and other children write), so a run leaves nothing in the system's.
SYSTEM_TMP = Path(tempfile.gettempdir())
RUN_TMP = Path(tempfile.mkdtemp(prefix="livesight-tests-"))
os.environ["TMPDIR"] = str(RUN_TMP)
os.environ["LIVESIGHT_DATA_DIR"] = str(RUN_TMP / "data")  # this process's servers' memory stores
tempfile.tempdir = str(RUN_TMP)
_SYSTEM_TMP_BEFORE = frozenset(p.name for p in SYSTEM_TMP.iterdir())

TESTS = Path(__file__).resolve().parent
TIER_MARKERS = ("core", "session", "socket", "heavy")
LIGHT_TIERS = frozenset({"core", "session"})
#: The fixtures of tests/real_server.py, tests/colours_models.py and tests/heavy/engines/conftest.py
#: that generate a model or start a server: never for a core or session test.
REAL_SERVER_FIXTURES = frozenset(
    {"tiny_model_dir", "server", "idefics3_model_dir", "colours_models", "demo_training", "vllm_servers"}
)
_ALL_LIGHT = pytest.StashKey[bool]()

#: The slowest files, slowest first (measured with ``--durations``): under ``make test`` each file
#: is one unit of work for a worker (its module fixtures start once), handed out in this order
#: and then in the order collected, so the long ones start first and the two workers end together.
SLOWEST_FIRST = (
    "heavy/server/test_watch_colours.py",
    "heavy/engines/test_engine_openai.py",
    "heavy/engines/test_engine_router.py",
    "heavy/engines/test_engine_check_vllm.py",
    "heavy/models/test_demo_model.py",
    "heavy/server/test_fuzz.py",
    "heavy/engines/test_engine_vllm.py",
    # after the vLLM files: its sessions must not shed under two busy cores, which a vLLM
    # starting on the other worker's side would add to
    "heavy/server/test_fairness.py",
    "socket/realtime/test_realtime.py",
    "heavy/server/test_intake_faults.py",
    "heavy/models/test_colours.py",
    "socket/engines/test_engine_cache.py",
    "heavy/server/test_gateway_routing.py",
    "heavy/speech/test_voice_recognisers.py",
    "heavy/browser/test_browser.py",
    "heavy/browser/test_agents_webrtc.py",
    "socket/webrtc/test_calls.py",
    "socket/webrtc/test_webrtc_colours.py",
    "socket/streams/test_streams.py",
    "socket/streams/test_stream_sources.py",
    "socket/server/test_session_ws.py",
    "heavy/server/test_fresh_boot.py",
    "heavy/realtime/test_sdk_versions.py",
)
#: Files whose tests share a server of the run (tests/vllm_servers.py) go to one worker together.
SHARED_UNITS = {
    "heavy/engines/test_engine_openai.py": "tiny-idefics3",
    "heavy/engines/test_engine_router.py": "tiny-idefics3",
}

def _relative(path: Path) -> str | None:
    try:
        return Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None


def tier_of(path: Path) -> str | None:
    """The tier of the test file at ``path``: the first folder under tests/ (None: outside one)."""
    rel = _relative(path)
    if rel is None or "/" not in rel:
        return None
    first = rel.split("/", 1)[0]
    return first if first in TIER_MARKERS else None


_TIER_EXPRESSION = re.compile(r"^(\s|\(|\)|\band\b|\bor\b|\bnot\b|" + "|".join(rf"\b{t}\b" for t in TIER_MARKERS) + r")*$")


def _selected_by(markexpr: str, tier: str) -> bool | None:
    """Whether ``-m markexpr`` keeps a test of ``tier``; None when it names other markers too."""
    if not markexpr.strip() or not _TIER_EXPRESSION.match(markexpr):
        return None
    return bool(eval(markexpr, {"__builtins__": {}}, {t: t == tier for t in TIER_MARKERS}))  # noqa: S307 - tokens checked above


def pytest_configure(config: pytest.Config) -> None:
    """pytest's temporary directories go in the run's own (unless ``--basetemp`` says otherwise)."""
    if config.option.basetemp is None:
        config.option.basetemp = str(RUN_TMP / "pytest")


def is_worker(config: pytest.Config) -> bool:
    """Whether this process is one of the run's pytest-xdist workers."""
    return hasattr(config, "workerinput")


def run_root(config: pytest.Config) -> Path:
    """The temporary directory of the whole run: the process that started the run's (a worker's
    own lies inside it, as its TMPDIR was the run's when it started)."""
    return Path(config.workerinput["livesight_run_root"]) if is_worker(config) else RUN_TMP  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist, each test file is one unit of work (``SHARED_UNITS`` joins some), so a
    file's module fixtures start once; units go out in the order collected (``--no-loadscope-reorder``)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            rel = nodeid.split("::", 1)[0].removeprefix(f"{TESTS.name}/")
            return SHARED_UNITS.get(rel, rel)

    return FileScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """A worker is told the run's temporary directory."""
    node.workerinput["livesight_run_root"] = str(RUN_TMP)  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)  # after the plugins have stopped what they started
def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's temporary directory goes; anything new the run left in the system's is named."""
    shutil.rmtree(RUN_TMP, ignore_errors=True)
    if is_worker(config):
        return  # its system's is the run's, which the process that started the run removes
    left = sorted(p.name for p in SYSTEM_TMP.iterdir() if p.name not in _SYSTEM_TMP_BEFORE)
    if left:
        print(f"\nnew in {SYSTEM_TMP} during the run (this run's or another process's): {left[:20]}", file=sys.stderr)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m`` with tiers only, the folders of the other tiers are not entered at all (their
    conftests and test files are never imported)."""
    if collection_path.resolve().parent == TESTS and collection_path.name in TIER_MARKERS:
        tier: str | None = collection_path.name
    elif collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        tier = tier_of(collection_path)
    else:
        return None
    if tier is None:
        return None  # collected, and refused below
    if _selected_by(config.option.markexpr or "", tier) is False:
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test its tier; refuse one outside the tier folders, with a tier marker of its own, or
    of a light tier asking for a real server."""
    problems = []
    for item in items:
        tier = tier_of(item.path)
        own = [m.name for m in item.iter_markers() if m.name in TIER_MARKERS]
        if tier is None:
            problems.append(f"{item.nodeid}: no tier (put its file under tests/core, tests/session, tests/socket or tests/heavy)")
            continue
        if own:
            problems.append(f"{item.nodeid}: marked {own} in its file; its tier comes from its folder ({tier})")
        if tier in LIGHT_TIERS and REAL_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            problems.append(f"{item.nodeid}: a {tier} test asks for a real server or model")
        item.add_marker(getattr(pytest.mark, tier))
    if problems:
        raise pytest.UsageError("tests without exactly one tier:\n  " + "\n  ".join(problems))
    rank = {rel: index for index, rel in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(_relative(item.path) or "", len(rank)))  # stable: collected order within
    config.stash[_ALL_LIGHT] = bool(items) and all(tier_of(item.path) in LIGHT_TIERS for item in items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that collected only core and session tests fails if torch was imported."""
    if session.config.stash.get(_ALL_LIGHT, False) and "torch" in sys.modules:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("ERROR: torch was imported by a run of core and session tests only", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def anyio_backend() -> str:
    """The anyio tests run on asyncio, as the server does."""
    return "asyncio"
