"""The deployment files in docker/: compose files valid (Debian's docker-compose), Dockerfile sane.

No Docker engine runs here; `docker-compose config` parses, validates and interpolates the
files, which is what can be checked without one.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
MODEL = "example-org/Some-VL-Model"


def _config(compose_file: str, **env: str) -> dict:
    """The compose file as docker-compose resolves it, with ``env`` as the variables."""
    tool = shutil.which("docker-compose")
    if tool is None:  # a missing tool must fail the suite, not skip it
        pytest.fail("docker-compose is not installed (Debian: apt-get install docker-compose)")
    result = subprocess.run(
        [tool, "-f", str(DOCKER / compose_file), "config"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


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
