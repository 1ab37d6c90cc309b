"""The import rules between layers, read from the source with ``ast`` (nothing is imported).

- handlers/core, handlers/wire and handlers/media are pure: no event loop library, web
  framework, socket client, torch, transformers or vLLM, and from ``server`` only the engine
  interface's types (server.engines.base) and WAV handling (server.speech.wav);
- server/speech and server/engines never import handlers;
- server/blocking.py imports nothing of livesight's;
- no module imports itself back through others (imports inside functions and under
  ``TYPE_CHECKING`` count);
- the core speaks its own events: it imports no codec (v1's server events and codec, the
  Realtime and Live codecs), and a codec takes from the core only its events.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("handlers", "server")

PURE_LAYERS = ("handlers.core", "handlers.wire", "handlers.media")
#: Libraries a pure layer must not import (each with its submodules).
NOT_IN_PURE = ("anyio", "fastapi", "starlette", "uvicorn", "torch", "transformers", "vllm", "websockets", "httpx")
#: What a pure layer may import from ``server``: the engine interface's types and WAV handling.
SERVER_FOR_PURE = ("server.engines.base", "server.speech.wav")


@dataclass(frozen=True)
class Import:
    """One import statement of a module: what it names, where, and whether inside a function."""

    module: str  # the module imported, resolved to a livesight module where it is one
    line: int
    in_function: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module under handlers/ and server/, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _is_package(name: str) -> bool:
    return name in modules() and modules()[name].name == "__init__.py"


def _imports_of(node: ast.AST, name: str, in_function: bool = False) -> Iterator[Import]:
    """The imports under ``node``; ``from pkg import x`` counts as importing ``pkg.x`` when that is a module."""
    for child in ast.iter_child_nodes(node):
        nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield Import(alias.name, child.lineno, in_function)
        elif isinstance(child, ast.ImportFrom):
            if child.level:  # relative: from the module's own package
                package = name if _is_package(name) else name.rpartition(".")[0]
                base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1])
                target = f"{base}.{child.module}" if child.module else base
            else:
                target = child.module or ""
            for alias in child.names:
                sub = f"{target}.{alias.name}"
                yield Import(sub if sub in modules() else target, child.lineno, in_function)
        yield from _imports_of(child, name, nested)


@cache
def imports() -> dict[str, tuple[Import, ...]]:
    """Each module's imports, top-level and inside functions alike."""
    return {name: tuple(_imports_of(ast.parse(path.read_text(), str(path)), name)) for name, path in modules().items()}


def _within(module: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _where(name: str, imp: Import) -> str:
    return f"{modules()[name].relative_to(ROOT)}:{imp.line} imports {imp.module}"


def _breaches(layers: tuple[str, ...], allowed: callable) -> list[str]:
    return [
        _where(name, imp)
        for name, found in imports().items()
        if _within(name, layers)
        for imp in found
        if not allowed(imp.module)
    ]


def test_the_source_tree_is_read() -> None:
    """The rules below see every layer (a wrong ROOT would make them pass on nothing)."""
    names = set(modules())
    for layer in (*PURE_LAYERS, "handlers.session", "server.engines", "server.speech", "server.blocking"):
        assert any(_within(n, layer) for n in names), layer
    assert sum(len(found) for found in imports().values()) > 100


@pytest.mark.parametrize("layer", PURE_LAYERS)
def test_pure_layers_import_no_io_framework_or_model_library(layer: str) -> None:
    """handlers/core, wire and media import no anyio, web framework, socket client, torch, transformers or vLLM."""
    assert _breaches((layer,), lambda module: not _within(module, NOT_IN_PURE)) == []


@pytest.mark.parametrize("layer", PURE_LAYERS)
def test_pure_layers_take_only_engine_types_and_wav_from_server(layer: str) -> None:
    """From server, a pure layer imports only server.engines.base and server.speech.wav."""
    assert _breaches((layer,), lambda module: not _within(module, "server") or module in SERVER_FOR_PURE) == []


@pytest.mark.parametrize("layer", ["server.speech", "server.engines"])
def test_speech_and_engines_never_import_handlers(layer: str) -> None:
    """server/speech and server/engines sit below the session layers: no import of handlers."""
    assert _breaches((layer,), lambda module: not _within(module, "handlers")) == []


def test_blocking_imports_nothing_of_livesight() -> None:
    """server/blocking.py, the off-loop helper everything uses, imports no handlers or server module."""
    assert _breaches(("server.blocking",), lambda module: not _within(module, PACKAGES)) == []


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected groups of ``graph`` (more than one node, or one importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def import_graph() -> dict[str, list[str]]:
    """Each livesight module and the livesight modules it imports."""
    return {
        name: sorted({imp.module for imp in found if imp.module in modules()})
        for name, found in imports().items()
    }


#: The codecs: every module of handlers/realtime and handlers/live, and v1's server side.
CODECS = ("handlers.realtime", "handlers.live", "handlers.wire.codec", "handlers.wire.server_events",
          "handlers.wire.running_answer", "handlers.wire.audio")


def test_the_core_imports_no_codec() -> None:
    """handlers/core builds its own events: no v1 server event, codec or other protocol's module."""
    assert _breaches(("handlers.core",), lambda module: not _within(module, CODECS)) == []


def test_codecs_take_only_the_cores_events() -> None:
    """A codec maps the core's events (handlers/core/events.py) and imports nothing else of the core."""
    layers = (*CODECS, "handlers.wire")
    assert _breaches(layers, lambda module: not _within(module, "handlers.core")
                     or module == "handlers.core.events") == []


def test_the_cycle_finder_finds_cycles() -> None:
    """The check below can fail: a loop of three, a module importing itself, and a clean chain."""
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["d"], "e": ["a"]}
    assert cycles(graph) == [["a", "b", "c"], ["d"]]
    assert cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_no_import_cycles() -> None:
    """No module imports itself back through others, counting imports inside functions."""
    assert cycles(import_graph()) == []


# ---------------------------------------------------------------------------- the core's surface
#: What of handlers/core the session layer may import: the machine and its vocabulary (its
#: effects and the events it says), the values it hands out (answers, jobs), config
#: negotiation and the control budget's buckets.
CORE_FOR_SESSION = ("handlers.core.machine", "handlers.core.effects", "handlers.core.events", "handlers.core.answer",
                    "handlers.core.jobs", "handlers.core.negotiation", "handlers.core.rate_limit")
#: Read-only values on the surface whose fields may be read (``core.limits.max_queue``).
VALUE_FIELDS = ("limits", "config")


def _core_reaches(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """Each ``<x>.core.NAME`` (``core.NAME`` on a local named core) in ``tree``: the line, NAME
    and the attribute read from it, if any (``core.NAME.FIELD``)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        is_core = (isinstance(owner, ast.Attribute) and owner.attr == "core") or (
            isinstance(owner, ast.Name) and owner.id == "core")
        if is_core:
            parent = parents.get(node)
            field = parent.attr if isinstance(parent, ast.Attribute) and parent.value is node else None
            yield node.lineno, node.attr, field


def test_the_session_layer_reads_only_the_cores_surface() -> None:
    """handlers/session calls the core through its entry points and reads only its documented
    surface (and fields of its read-only values); it imports nothing of the core's parts."""
    from handlers.core.machine import SessionMachine

    allowed = SessionMachine.ENTRY_POINTS | SessionMachine.SURFACE
    bad = []
    for name, path in modules().items():
        if not name.startswith("handlers.session"):
            continue
        tree = ast.parse(path.read_text())
        for line, attr, field in _core_reaches(tree):
            if attr not in allowed:
                bad.append(f"{path.name}:{line}: core.{attr}")
            elif field is not None and attr not in VALUE_FIELDS and attr not in SessionMachine.ENTRY_POINTS:
                bad.append(f"{path.name}:{line}: core.{attr}.{field}")
        for imp in imports()[name]:
            if imp.module.startswith("handlers.core") and not imp.module.startswith(CORE_FOR_SESSION):
                bad.append(f"{path.name}:{imp.line}: imports {imp.module}")
    assert bad == []


def test_the_adapter_calls_the_core_through_at_most_five_entry_points() -> None:
    """The WebSocket adapter and its executor call the core through no more than five methods."""
    from handlers.core.machine import SessionMachine

    called = set()
    for name in ("handlers.session.adapter", "handlers.session.executor"):
        tree = ast.parse(modules()[name].read_text())
        called |= {attr for _, attr, _ in _core_reaches(tree) if attr in SessionMachine.ENTRY_POINTS}
    assert len(called) <= 5, called


def test_the_surface_check_can_fail() -> None:
    """A reach into the core's parts and a chain through it are both named."""
    tree = ast.parse("self.core.buffer.frames\nself.core.limits.max_queue\ncore.receive(x)\n")
    assert list(_core_reaches(tree)) == [(1, "buffer", "frames"), (2, "limits", "max_queue"), (3, "receive", None)]
