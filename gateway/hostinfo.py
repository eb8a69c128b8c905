"""What kind of host the gateway runs on, for the platform rule: macOS, an NVIDIA GPU, or neither.
Called once at startup; never raises."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable

from gateway.config import PlatformName
from gateway.policy.rules import Platform

NVIDIA_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidia0")


def nvidia_smi_lists_gpu(executable: str = "nvidia-smi", timeout_s: float = 2.0) -> bool:
    """True when `nvidia-smi -L` exits 0 within `timeout_s` and names a GPU."""
    path = shutil.which(executable)
    if path is None:
        return False
    try:
        done = subprocess.run(
            [path, "-L"], capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and b"GPU" in done.stdout


def detect_platform(
    *,
    system: str | None = None,
    path_exists: Callable[[str], bool] = os.path.exists,
    probe_nvidia_smi: Callable[[], bool] = nvidia_smi_lists_gpu,
) -> Platform:
    """`mac` on macOS; `nvidia_gpu` when the NVIDIA driver or `nvidia-smi` shows a GPU; else
    `no_nvidia_gpu`. The keyword arguments exist for tests."""
    if (sys.platform if system is None else system) == "darwin":
        return "mac"
    try:
        if any(path_exists(p) for p in NVIDIA_PATHS) or probe_nvidia_smi():
            return "nvidia_gpu"
    except Exception:  # a probe must never stop the gateway from starting
        return "no_nvidia_gpu"
    return "no_nvidia_gpu"


def resolve_platform(setting: PlatformName, detect: Callable[[], Platform] = detect_platform) -> Platform:
    """The configured platform, or the detected one for `auto`."""
    if setting == "auto":
        return detect()
    return setting
