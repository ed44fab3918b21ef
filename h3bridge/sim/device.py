"""The simulated Metal device (h3_device_info, h3.h:137-146), configured by environment.

Upstream fills it in h3_metal_probe (h3_metal.m:15-46); `is_m5` mirrors h3_gpu_is_m5
(h3_gpu.m:531-535: the device name contains "M5"), which selects the GPU sampler
("denoise enqueue" then "denoise") and the 3-layer text-encoder ring.

Variables (all optional; defaults describe a 128 GiB M5 Max):
  H3_SIM_DEVICE_NAME            device name                      "Apple M5 Max"
  H3_SIM_DEVICE_ARCHITECTURE    architecture name                "applegpu_g17s"
  H3_SIM_PHYSICAL_MEMORY        bytes, or a number with G/GiB    128 GiB
  H3_SIM_RECOMMENDED_WORKING_SET  bytes or G/GiB                 75% of physical memory
  H3_SIM_MAX_BUFFER_LENGTH      bytes or G/GiB                   50% of physical memory
  H3_SIM_GPU_FAMILY             Apple GPU family number          10
  H3_SIM_METAL4                 1/0                              1
  H3_SIM_UNIFIED_MEMORY         1/0                              1
  H3_SIM_NO_METAL               1 => h3_load_dir fails "no Metal device available"
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

GIB = 1024 ** 3


class DeviceConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SimDevice:
    name: str
    architecture: str
    physical_memory: int
    recommended_working_set: int
    max_buffer_length: int
    apple_gpu_family: int
    metal4: bool
    unified_memory: bool

    @property
    def is_m5(self) -> bool:
        return "M5" in self.name


def parse_bytes(text: str, variable: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(G|GB|GiB|g)?\s*", text)
    if not match:
        raise DeviceConfigError(f"{variable} must be a byte count or a number of GiB "
                                f"like 128G, not {text!r}")
    value = float(match.group(1))
    return int(value * GIB) if match.group(2) else int(value)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "no", "false", "off")


def device_from_env() -> SimDevice | None:
    """The configured device, or None when H3_SIM_NO_METAL asks for no Metal device."""
    if _flag("H3_SIM_NO_METAL", False):
        return None
    env = os.environ
    physical = parse_bytes(env["H3_SIM_PHYSICAL_MEMORY"], "H3_SIM_PHYSICAL_MEMORY") \
        if env.get("H3_SIM_PHYSICAL_MEMORY") else 128 * GIB
    working = parse_bytes(env["H3_SIM_RECOMMENDED_WORKING_SET"], "H3_SIM_RECOMMENDED_WORKING_SET") \
        if env.get("H3_SIM_RECOMMENDED_WORKING_SET") else physical * 3 // 4
    max_buffer = parse_bytes(env["H3_SIM_MAX_BUFFER_LENGTH"], "H3_SIM_MAX_BUFFER_LENGTH") \
        if env.get("H3_SIM_MAX_BUFFER_LENGTH") else physical // 2
    family_text = env.get("H3_SIM_GPU_FAMILY") or "10"
    if not family_text.isdigit():
        raise DeviceConfigError(f"H3_SIM_GPU_FAMILY must be an integer, not {family_text!r}")
    return SimDevice(
        name=env.get("H3_SIM_DEVICE_NAME") or "Apple M5 Max",
        architecture=env.get("H3_SIM_DEVICE_ARCHITECTURE") or "applegpu_g17s",
        physical_memory=physical,
        recommended_working_set=working,
        max_buffer_length=max_buffer,
        apple_gpu_family=int(family_text),
        metal4=_flag("H3_SIM_METAL4", True),
        unified_memory=_flag("H3_SIM_UNIFIED_MEMORY", True),
    )
