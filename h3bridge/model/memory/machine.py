"""The machine the plan is for: its memory, chip and the budget left after macOS and apps."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass

from .constants import GIB, RESERVE_FRACTION, RESERVE_MINIMUM


# Machine


@dataclass(frozen=True)
class MachineFacts:
    """What the plan needs to know about the machine (inject one in tests)."""

    total_memory: int              # physical (unified) memory, bytes
    chip: str | None = None        # e.g. "Apple M4 Pro"; None when unknown (not a Mac)
    system: str = "Darwin"
    # H3_NAX=0 in the environment h3 inherits turns Metal TensorOps (and so the int8 DiT) off
    # (h3_gpu.m h3_gpu_create, l.363-368).
    tensor_ops_disabled: bool = False
    # Metal's recommendedMaxWorkingSetSize (libh3's h3_device): what the GPU may hold, when known
    # (the library engine asks the library); the budget never exceeds it.
    gpu_working_set: int | None = None

    @classmethod
    def detect(cls) -> "MachineFacts":
        import psutil
        system = platform.system()
        chip: str | None = None
        if system == "Darwin":
            try:
                chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                      text=True, timeout=5, check=False).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                chip = None
        return cls(total_memory=psutil.virtual_memory().total, chip=chip, system=system,
                   tensor_ops_disabled=os.environ.get("H3_NAX") == "0")

    @classmethod
    def mac(cls, gigabytes: float, chip: str = "Apple M4 Pro") -> "MachineFacts":
        """A Mac sold as `gigabytes` GB (Apple's GB of unified memory are GiB)."""
        return cls(total_memory=int(gigabytes * GIB), chip=chip, system="Darwin")

    @property
    def is_m5(self) -> bool:
        """h3_gpu.m h3_gpu_is_m5 (l.531-535): the Metal device name contains "M5". The device name
        and the CPU brand string are both "Apple M5 ..." on Apple Silicon."""
        return "M5" in (self.chip or "")

    @property
    def int8_dit(self) -> bool:
        """h3_gpu_has_int8_mlp (h3_gpu.m l.543-546) is `tensorOpsEnabled`: an "M5" device, H3_NAX
        not "0", and a successful compile of the shaders with TensorOps (l.363-393). The compile
        is only known at run time; it fails on a Metal runtime without Metal 4 TensorOps, which M5
        Macs (shipped with macOS 26) have, so an M5 is planned with the int8 DiT and the plan notes
        what the BF16 fallback would need (see `plan_memory`)."""
        return self.is_m5 and not self.tensor_ops_disabled

    @property
    def text_ring_depth(self) -> int:
        # h3_text_encoder.c text_prefetch_depth (l.135-137): 3 on an M5 device name, else 2
        # (TensorOps not required); README "Weight residency": "two layers on M3/older hardware
        # and three on M5"
        return 3 if self.is_m5 else 2

    @property
    def reserve(self) -> int:
        """Memory left to macOS and apps: 20 % of RAM, at least 6 GiB (h3bridge policy)."""
        return max(RESERVE_MINIMUM, int(self.total_memory * RESERVE_FRACTION))

    @property
    def budget(self) -> int:
        budget = self.total_memory - self.reserve
        return budget if self.gpu_working_set is None else min(budget, self.gpu_working_set)

    def describe(self) -> str:
        return f"{self.chip or self.system}, {self.total_memory / GIB:.0f} GiB"
