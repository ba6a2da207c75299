"""What NVIDIA publishes about CUDA versions, drivers and GPUs, as data (issue 24;
docs/image-cuda.md names the pages):

- the driver branch each CUDA release came with (the CUDA Toolkit release notes, "CUDA
  Toolkit and Corresponding Driver Versions"): a driver of that branch or newer gives
  that CUDA version, which is what a fix names;
- the GPU brands NVML reports (nvmlBrandType_t), as the words NVIDIA's CUDA images use in
  their `brand=` conditions, and the name libnvidia-container gives each (src/driver.c:
  six brands have their own name, every other is "Unknown");
- which brands forward compatibility serves (CUDA Compatibility, "Forward
  Compatibility": NVIDIA data-centre GPUs, select NGC Server Ready RTX SKUs, Jetson).

Standard library only.
"""

from __future__ import annotations

import re

# CUDA major.minor -> the driver branch it shipped with (Linux x86_64)
CUDA_DRIVER_BRANCH: dict[tuple[int, int], int] = {
    (11, 0): 450, (11, 1): 455, (11, 2): 460, (11, 3): 465, (11, 4): 470, (11, 5): 495,
    (11, 6): 510, (11, 7): 515, (11, 8): 520, (12, 0): 525, (12, 1): 530, (12, 2): 535,
    (12, 3): 545, (12, 4): 550, (12, 5): 555, (12, 6): 560, (12, 8): 570, (12, 9): 575,
    (13, 0): 580,
}

# nvmlBrandType_t -> the word of `brand=` in NVIDIA's CUDA images
NVML_BRANDS = {
    0: "unknown", 1: "quadro", 2: "tesla", 3: "nvs", 4: "grid", 5: "geforce", 6: "titan",
    7: "vapps", 8: "vpc", 9: "vcs", 10: "vws", 11: "cloudgaming", 12: "quadrortx",
    13: "nvidiartx", 14: "nvidia", 15: "geforcertx", 16: "titanrtx",
}
# nvidia-smi -q's <product_brand>, spaces removed, lower case -> the same words
_SMI_BRANDS = {"nvidiavirtualapplications": "vapps", "nvidiavirtualpc": "vpc",
               "nvidiavirtualcomputeserver": "vcs", "nvidiartxvirtualworkstation": "vws",
               "nvidiacloudgaming": "cloudgaming"}
# The names libnvidia-container's driver.c gives (compared without regard to case)
_TOOLKIT_NAMES = {"quadro": "Quadro", "tesla": "Tesla", "nvs": "NVS", "grid": "GRID",
                  "geforce": "GeForce", "titan": "TITAN"}
# Forward compatibility: served on these, refused on consumer boards
# (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE); other brands depend on the SKU.
FORWARD_COMPAT_BRANDS = frozenset({"tesla", "nvidia"})
NO_FORWARD_COMPAT_BRANDS = frozenset({"geforce", "geforcertx", "titan", "titanrtx"})

# at most 9 digits a part: an image's CUDA_VERSION of thousands of digits is no version
# here (Python refuses to convert those; the toolkit's parse refuses it: cuda_require.py)
_VERSION = re.compile(r"v?(\d{1,9})\.(\d{1,9})(?!\d)")


def brand_of_smi(text: str) -> str | None:
    """The brand word for nvidia-smi's product_brand; None for one not known here."""
    key = text.replace(" ", "").lower()
    if key in NVML_BRANDS.values():
        return key
    return _SMI_BRANDS.get(key)


def toolkit_names(brand: str) -> tuple[str, ...]:
    """The names the container toolkit may give a brand: the one of the libnvidia-container
    read (six own names, "Unknown" for the rest) and the word NVIDIA's images use, which
    newer releases may give; the images list both."""
    return tuple(dict.fromkeys((_TOOLKIT_NAMES.get(brand, "Unknown"), brand)))


def major_minor(text: str | None) -> tuple[int, int] | None:
    """(12, 8) of "12.8", "12.8.1", "v12.8"; None when it is no version."""
    match = _VERSION.match(text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def shown(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def branch_for(cuda: tuple[int, int]) -> int | None:
    """The oldest driver branch that gives this CUDA version, when the table knows it."""
    return CUDA_DRIVER_BRANCH.get(cuda)


def driver_major(driver: str | None) -> int | None:
    match = re.match(r"(\d+)", driver or "")
    return int(match.group(1)) if match else None
