"""The deployment files in docker/: compose files valid (Debian's docker-compose), Dockerfile sane.

No Docker engine runs here; `docker-compose config` parses, validates and interpolates the
files, which is what can be checked without one. The container's health check script runs
here against small http and https servers.
"""

from __future__ import annotations

import http.server
import os
import re
import runpy
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
MODEL = "example-org/Some-VL-Model"
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.single.yml")
HEALTHCHECK = ["CMD", "python3", "/opt/livesight/docker/healthcheck.py"]
TLS_ON = {"LIVESIGHT_SSL_CERTFILE": "/certs/cert.pem", "LIVESIGHT_SSL_KEYFILE": "/certs/key.pem"}


def _compose(compose_path: Path, env: dict[str, str], env_file: Path | None) -> dict:
    tool = shutil.which("docker-compose")
    if tool is None:  # a missing tool must fail the suite, not skip it
        pytest.fail("docker-compose is not installed (Debian: apt-get install docker-compose)")
    # The caller's own deployment variables (its shell, its docker/.env) must not leak in.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LIVESIGHT_", "VLLM_")) and k != "MODEL"}
    command = [tool, "-f", str(compose_path)]
    if env_file is not None:
        command += ["--env-file", str(env_file)]
    result = subprocess.run(
        [*command, "config"], capture_output=True, text=True, env={**clean, **env}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def _config(compose_file: str, **env: str) -> dict:
    """The compose file as docker-compose resolves it, with ``env`` as the only variables."""
    empty = Path(os.environ.get("TMPDIR", "/tmp")) / f"livesight-empty-{os.getpid()}.env"
    empty.write_text("")
    try:
        return _compose(DOCKER / compose_file, env, empty)
    finally:
        empty.unlink()


def _gpu_reserved(service: dict) -> bool:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    return any("gpu" in d.get("capabilities", []) for d in devices)


def test_two_service_compose_is_valid() -> None:
    """docker-compose.yml: vLLM (GPU, model cache, prefix caching, health check) and livesight on it."""
    config = _config("docker-compose.yml", MODEL=MODEL, TENSOR_PARALLEL_SIZE="2")
    vllm, livesight = config["services"]["vllm"], config["services"]["livesight"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert _gpu_reserved(vllm) and "healthcheck" in vllm
    assert f"--model={MODEL}" in vllm["command"] and "--enable-prefix-caching" in vllm["command"]
    assert "--tensor-parallel-size=2" in vllm["command"]
    assert any(str(v).startswith("model-cache:") for v in vllm["volumes"])  # the model cache volume
    env = livesight["environment"]
    assert env["LIVESIGHT_ENGINE"] == "openai" and env["LIVESIGHT_MODEL"] == MODEL
    assert env["LIVESIGHT_OPENAI_URLS"] == "http://vllm:8000"
    assert livesight["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert livesight["build"]["dockerfile"] == "docker/Dockerfile"


def test_single_container_compose_is_valid() -> None:
    """docker-compose.single.yml: one container, vLLM in process, on the GPU."""
    config = _config("docker-compose.single.yml", MODEL=MODEL, PIPELINE_PARALLEL_SIZE="2")
    (service,) = config["services"].values()
    env = service["environment"]
    assert env["LIVESIGHT_ENGINE"] == "vllm" and env["LIVESIGHT_MODEL"] == MODEL
    assert str(env["LIVESIGHT_PIPELINE_PARALLEL_SIZE"]) == "2"
    assert _gpu_reserved(service) and "healthcheck" in service


def test_dockerfile_builds_on_vllm_image_and_keeps_its_torch() -> None:
    """The image is the official vLLM one plus livesight, without replacing its torch/transformers."""
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "ARG VLLM_IMAGE=vllm/vllm-openai:" in dockerfile and "FROM ${VLLM_IMAGE}" in dockerfile
    assert 'ENTRYPOINT ["livesight", "serve"]' in dockerfile
    script = runpy.run_path(str(DOCKER / "runtime_requirements.py"))
    requirements = script["runtime_requirements"](str(DOCKER.parent / "pyproject.toml"))
    names = {script["requirement_name"](r) for r in requirements}
    assert "fastapi" in names and "httpx" in names
    assert not names & {"torch", "transformers", "tokenizers"}


def test_monitoring_profile_adds_prometheus_and_grafana() -> None:
    """The `monitoring` profile: Prometheus scraping livesight, Grafana with its provisioning files present."""
    config = _config("docker-compose.yml", MODEL=MODEL, LIVESIGHT_API_KEYS="k1,k2")
    prometheus, grafana = config["services"]["prometheus"], config["services"]["grafana"]
    assert prometheus["profiles"] == ["monitoring"] and grafana["profiles"] == ["monitoring"]
    assert "profiles" not in config["services"]["livesight"]  # the default `up` is unchanged
    assert prometheus["environment"]["LIVESIGHT_KEYS"] == "k1,k2"
    for service in (prometheus, grafana):
        for volume in service["volumes"]:
            source = str(volume).split(":")[0]
            if source.startswith("/"):  # a bind mount: the file or folder must be in the repository
                assert Path(source).exists(), source
    scrape = yaml.safe_load((DOCKER / "monitoring" / "prometheus.yml").read_text())
    (livesight_job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "livesight"]
    assert livesight_job["static_configs"][0]["targets"] == ["livesight:8000"]
    assert livesight_job["metrics_path"] == "/metrics"


def test_router_profile_puts_haproxy_in_front_of_both_tiers() -> None:
    """The `router` profile: HAProxy on the repository's haproxy.cfg (which HAProxy itself
    accepts with the profile's addresses) in front of the two gateways and the two vLLM
    replicas, both gateways reaching vLLM through it; the default `up` is unchanged."""
    config = _config("docker-compose.yml", MODEL=MODEL, LIVESIGHT_OPENAI_URLS="http://haproxy:9000")
    services = config["services"]
    assert {services[n]["profiles"][0] for n in ("haproxy", "vllm-b", "livesight-b")} == {"router"}
    assert "profiles" not in services["livesight"] and "profiles" not in services["vllm"]
    env = services["haproxy"]["environment"]
    assert (env["LIVESIGHT_GATEWAY_1"], env["LIVESIGHT_GATEWAY_2"]) == ("livesight:8000", "livesight-b:8000")
    assert (env["VLLM_1"], env["VLLM_2"]) == ("vllm:8000", "vllm-b:8000")
    for gateway in ("livesight", "livesight-b"):
        assert services[gateway]["environment"]["LIVESIGHT_OPENAI_URLS"] == "http://haproxy:9000"
    (mount,) = services["haproxy"]["volumes"]
    assert str(mount).split(":")[0] == str(DOCKER / "haproxy.cfg")
    assert _config("docker-compose.yml", MODEL=MODEL)["services"]["livesight"]["environment"][
        "LIVESIGHT_OPENAI_URLS"] == "http://vllm:8000"
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.fail("haproxy is not installed (make system-deps installs it)")
    checked = subprocess.run([haproxy, "-c", "-f", str(DOCKER / "haproxy.cfg")], capture_output=True, text=True,
                             env={**os.environ, **{k: str(v) for k, v in env.items()}})
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_stop_grace_period_outlasts_the_drain() -> None:
    """Both compose files give the server longer to stop than its drain timeout (plus margin)."""
    for name in ("docker-compose.yml", "docker-compose.single.yml"):
        service = _config(name, MODEL=MODEL)["services"]["livesight"]
        grace = str(service["stop_grace_period"])
        assert grace.endswith("s") and grace[:-1].isdigit(), grace
        drain = float(service["environment"]["LIVESIGHT_DRAIN_TIMEOUT_S"])
        assert int(grace[:-1]) >= drain + 5, (name, grace, drain)


def test_vllm_image_is_the_base_of_the_livesight_build() -> None:
    """VLLM_IMAGE reaches the Dockerfile's ARG as a build argument, in both compose files, and
    is the image of the vLLM services."""
    image = "registry.example/vllm-openai:v9"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE=", dockerfile, flags=re.M)
    for name in COMPOSE_FILES:
        services = _config(name, MODEL=MODEL, VLLM_IMAGE=image)["services"]
        assert services["livesight"]["build"]["args"]["VLLM_IMAGE"] == image, name
        default = _config(name, MODEL=MODEL)["services"]["livesight"]["build"]["args"]["VLLM_IMAGE"]
        assert default == re.search(r"^ARG VLLM_IMAGE=(\S+)", dockerfile, flags=re.M).group(1), name
    assert _config("docker-compose.yml", MODEL=MODEL, VLLM_IMAGE=image)["services"]["vllm"]["image"] == image


def test_env_file_is_read_from_the_compose_files_folder(tmp_path: Path) -> None:
    """A `.env` beside the compose file sets its variables (what deployment.md tells operators
    to write in docker/.env)."""
    shutil.copy(DOCKER / "docker-compose.yml", tmp_path / "docker-compose.yml")
    (tmp_path / ".env").write_text(f"MODEL={MODEL}\nVLLM_GPUS=3\n")
    services = _compose(tmp_path / "docker-compose.yml", {}, None)["services"]
    assert services["livesight"]["environment"]["LIVESIGHT_MODEL"] == MODEL
    assert _gpu_ids(services["vllm"]) == ["3"]


def _gpu_ids(service: dict) -> list[str]:
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert "count" not in device  # Docker refuses count beside device_ids
    return [str(i) for i in device["device_ids"]]


def test_each_vllm_replica_has_its_own_gpus() -> None:
    """The router profile's two vLLM replicas reserve different GPUs (0 and 1 by default, or
    VLLM_GPUS / VLLM_B_GPUS), so each may take 90% of its own GPU."""
    services = _config("docker-compose.yml", MODEL=MODEL)["services"]
    assert (_gpu_ids(services["vllm"]), _gpu_ids(services["vllm-b"])) == (["0"], ["1"])
    services = _config("docker-compose.yml", MODEL=MODEL, VLLM_GPUS="0,1", VLLM_B_GPUS="2,3")["services"]
    assert (_gpu_ids(services["vllm"]), _gpu_ids(services["vllm-b"])) == (["0,1"], ["2,3"])
    for name in ("vllm", "vllm-b"):
        assert "NVIDIA_VISIBLE_DEVICES" not in services[name].get("environment", {})


@pytest.mark.parametrize("compose_file", COMPOSE_FILES)
def test_tls_through_compose(compose_file: str) -> None:
    """TLS off: no LIVESIGHT_SSL_* reaches the container (an empty path would not mean "none").
    TLS on: the paths reach it, the certificates folder is mounted read-only at /certs, and
    the health check is the script that picks https."""
    off = _config(compose_file, MODEL=MODEL)["services"]["livesight"]
    for name in ("LIVESIGHT_SSL_CERTFILE", "LIVESIGHT_SSL_KEYFILE", "LIVESIGHT_SSL_KEYFILE_PASSWORD"):
        assert off["environment"][name] is None, name  # passed only when set
    on = _config(compose_file, MODEL=MODEL, LIVESIGHT_SSL_KEYFILE_PASSWORD="pw", **TLS_ON)["services"]["livesight"]
    assert {k: on["environment"][k] for k in TLS_ON} == TLS_ON
    assert on["environment"]["LIVESIGHT_SSL_KEYFILE_PASSWORD"] == "pw"
    mounts = [str(v) for v in on["volumes"]]
    assert f"{DOCKER / 'certs'}:/certs:ro" in mounts, mounts
    assert (DOCKER / "certs").is_dir()  # present, so Docker does not create it as root
    custom = _config(compose_file, MODEL=MODEL, TLS_CERTS_DIR="/etc/livesight-certs")["services"]["livesight"]
    assert "/etc/livesight-certs:/certs:ro" in [str(v) for v in custom["volumes"]]
    assert on["healthcheck"]["test"] == HEALTHCHECK


def test_every_livesight_health_check_runs_the_script() -> None:
    """The image and every livesight service check health with docker/healthcheck.py, which
    the image copies to the path they call."""
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert 'CMD ["python3", "/opt/livesight/docker/healthcheck.py"]' in dockerfile
    assert re.search(r"^WORKDIR /opt/livesight$", dockerfile, flags=re.M)
    assert re.search(r"^COPY .*docker/healthcheck\.py docker/$", dockerfile, flags=re.M)
    for name in COMPOSE_FILES:
        for service_name, service in _config(name, MODEL=MODEL)["services"].items():
            if service.get("image") == "livesight:latest":
                assert service["healthcheck"]["test"] == HEALTHCHECK, (name, service_name)


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200 if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _healthz_server(tls_dir: Path | None) -> Iterator[int]:
    """A server answering /healthz on 127.0.0.1 (over TLS with a self-signed certificate when
    ``tls_dir`` is given); yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    if tls_dir is not None:
        from server.bench.tls import self_signed

        cert, key = self_signed(tls_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _run_healthcheck(env: dict[str, str]) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LIVESIGHT_")}
    return subprocess.run([sys.executable, str(DOCKER / "healthcheck.py")], env={**clean, **env},
                          capture_output=True, timeout=30).returncode


def test_health_check_follows_the_tls_setting(tmp_path: Path) -> None:
    """The health check asks over http with TLS off and over https (self-signed certificate
    accepted) with LIVESIGHT_SSL_CERTFILE set; asking with the wrong scheme fails."""
    with _healthz_server(None) as port:
        assert _run_healthcheck({"LIVESIGHT_PORT": str(port)}) == 0
        assert _run_healthcheck({"LIVESIGHT_PORT": str(port), **TLS_ON}) == 1
    with _healthz_server(tmp_path) as port:
        assert _run_healthcheck({"LIVESIGHT_PORT": str(port), **TLS_ON}) == 0
        assert _run_healthcheck({"LIVESIGHT_PORT": str(port)}) == 1
    script = runpy.run_path(str(DOCKER / "healthcheck.py"))
    assert script["health_url"]({}) == "http://127.0.0.1:8000/healthz"


def _dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)  # the matcher below has no exceptions
    return patterns


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore leaves ``path`` (or a folder above it) out of the build context."""
    def regex(pattern: str) -> str:
        parts = []
        for part in pattern.strip("/").split("/"):
            parts.append(".*" if part == "**" else re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]"))
        return "/".join(parts).replace(".*/", "(?:.*/)?")
    pieces = path.strip("/").split("/")
    prefixes = ["/".join(pieces[: i + 1]) for i in range(len(pieces))]
    return any(re.fullmatch(regex(p), prefix) for p in patterns for prefix in prefixes)


def test_dockerignore_keeps_the_build_context_small_and_secret_free() -> None:
    """.dockerignore leaves out the .venv of `make setup`, .git, caches, tests and local
    secrets (docker/.env, docker/certs), and nothing the Dockerfile copies."""
    patterns = _dockerignore_patterns()
    for path in (".venv/lib/python3.11/site-packages/torch/lib/x.so", ".git/objects/ab", "docker/.env",
                 "docker/certs/key.pem", "server/__pycache__/app.cpython-311.pyc", "livesight.egg-info/PKG-INFO",
                 ".pytest_cache/v", ".hypothesis/examples", "tests/heavy/docker/test_docker.py"):
        assert _ignored(path, patterns), path
    copies = re.findall(r"^COPY (.+)$", (DOCKER / "Dockerfile").read_text(), flags=re.M)
    sources = [src for line in copies for src in line.split()[:-1]]
    assert "server" in sources and "docker/healthcheck.py" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), source
    assert not _ignored("server/app.py", patterns) and not _ignored("static/index.html", patterns)
