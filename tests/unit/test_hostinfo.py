"""Platform detection for the platform rule: macOS, an NVIDIA GPU, or neither; never raises."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from gateway.hostinfo import NVIDIA_PATHS, detect_platform, nvidia_smi_lists_gpu, resolve_platform

pytestmark = pytest.mark.unit

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="uses a shell script as a fake nvidia-smi")


def no_paths(path: str) -> bool:
    return False


def never() -> bool:
    return False


def always() -> bool:
    return True


def boom(*args: object) -> bool:
    raise PermissionError("probe failed")


@pytest.mark.parametrize(
    ("system", "paths", "smi", "expected"),
    [
        ("darwin", set(NVIDIA_PATHS), always, "mac"),
        ("linux", set(), never, "no_nvidia_gpu"),
        ("linux", {"/proc/driver/nvidia/version"}, never, "nvidia_gpu"),
        ("linux", {"/dev/nvidia0"}, never, "nvidia_gpu"),
        ("linux", set(), always, "nvidia_gpu"),
        ("linux", {"/dev/other"}, never, "no_nvidia_gpu"),
        ("win32", set(), always, "nvidia_gpu"),
    ],
)
def test_detect_platform(system: str, paths: set[str], smi: object, expected: str) -> None:
    assert detect_platform(system=system, path_exists=paths.__contains__, probe_nvidia_smi=smi) == expected  # type: ignore[arg-type]


def test_a_failing_probe_means_no_gpu_not_an_error() -> None:
    assert detect_platform(system="linux", path_exists=boom, probe_nvidia_smi=always) == "no_nvidia_gpu"
    assert detect_platform(system="linux", path_exists=no_paths, probe_nvidia_smi=boom) == "no_nvidia_gpu"


def test_detect_platform_on_this_host_returns_a_platform() -> None:
    assert detect_platform() in ("mac", "no_nvidia_gpu", "nvidia_gpu")


@pytest.mark.parametrize("setting", ["mac", "no_nvidia_gpu", "nvidia_gpu"])
def test_an_explicit_setting_wins(setting: str) -> None:
    def fail() -> str:
        raise AssertionError("auto-detection must not run")

    assert resolve_platform(setting, detect=fail) == setting  # type: ignore[arg-type]


def test_auto_detects() -> None:
    assert resolve_platform("auto", detect=lambda: "no_nvidia_gpu") == "no_nvidia_gpu"


def fake_smi(tmp_path: Path, body: str) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@posix_only
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)"', True),
        ('echo "NVIDIA-SMI has failed because it could not communicate with the driver"; exit 9', False),
        ("exit 0", False),
        ('echo "GPU 0: x"; exit 1', False),
    ],
)
def test_nvidia_smi_probe(tmp_path: Path, body: str, expected: bool) -> None:
    assert nvidia_smi_lists_gpu(fake_smi(tmp_path, body)) is expected


@posix_only
def test_nvidia_smi_probe_times_out_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    assert nvidia_smi_lists_gpu(fake_smi(tmp_path, "exec sleep 30"), timeout_s=0.3) is False
    assert time.monotonic() - started < 5


def test_nvidia_smi_probe_without_the_binary(tmp_path: Path) -> None:
    assert nvidia_smi_lists_gpu(str(tmp_path / "no-such-nvidia-smi")) is False


@posix_only
def test_nvidia_smi_probe_that_cannot_execute(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_bytes(b"\x7fELF-not-really")
    script.chmod(0o755)
    assert nvidia_smi_lists_gpu(str(script)) is False
