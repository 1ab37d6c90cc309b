"""Print livesight's runtime requirements minus the packages a vLLM image already has.

Used by the Dockerfile: the image's torch and transformers are CUDA builds matched to its
vLLM, so livesight's own pins on them must not replace them.
    python3 docker/runtime_requirements.py pyproject.toml > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib

PROVIDED_BY_VLLM = {"torch", "transformers", "tokenizers", "safetensors", "numpy", "pillow"}


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string."""
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if name is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", name.group(1)).lower()


def runtime_requirements(pyproject_path: str) -> list[str]:
    with open(pyproject_path, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if requirement_name(d) not in PROVIDED_BY_VLLM]


if __name__ == "__main__":
    print("\n".join(runtime_requirements(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")))
