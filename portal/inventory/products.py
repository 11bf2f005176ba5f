"""GPU product names (as NVML and GPU Feature Discovery spell them) → our model names.

NVML reports ``NVIDIA H100 80GB HBM3``; GPU Feature Discovery labels the same GPU
``NVIDIA-H100-80GB-HBM3``. Both normalize to the model name flavors use, ``H100-80GB``. Models
that share a MIG geometry share a name (SXM and PCIe A100-80GB are both ``A100-80GB``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Product:
    """A known GPU product: our model name and its usual memory (used when none is reported)."""

    model: str
    memory_mib: int


# Keys are normalized spellings (see ``_key``): upper case, '-' between words, without the
# "NVIDIA-" / "TESLA-" prefix.
_PRODUCTS: dict[str, Product] = {
    # A100
    "A100-SXM4-40GB": Product("A100-40GB", 40960),
    "A100-PCIE-40GB": Product("A100-40GB", 40960),
    "A100-40GB-PCIE": Product("A100-40GB", 40960),
    "A100-SXM4-80GB": Product("A100-80GB", 81920),
    "A100-PCIE-80GB": Product("A100-80GB", 81920),
    "A100-80GB-PCIE": Product("A100-80GB", 81920),
    # H100
    "H100-80GB-HBM3": Product("H100-80GB", 81559),
    "H100-SXM5-80GB": Product("H100-80GB", 81559),
    "H100-PCIE": Product("H100-80GB", 81559),
    "H100-NVL": Product("H100-94GB", 95830),
    # H200
    "H200": Product("H200-141GB", 143771),
    "H200-NVL": Product("H200-141GB", 143771),
    "H200-141GB-HBM3E": Product("H200-141GB", 143771),
    # Others
    "A30": Product("A30-24GB", 24576),
    "A10": Product("A10", 23028),
    "A10G": Product("A10G", 23028),
    "A40": Product("A40", 46068),
    "L4": Product("L4", 23034),
    "L40": Product("L40", 46068),
    "L40S": Product("L40S", 46068),
    "T4": Product("T4", 15360),
    "V100-SXM2-16GB": Product("V100-16GB", 16384),
    "V100-PCIE-16GB": Product("V100-16GB", 16384),
    "V100-SXM2-32GB": Product("V100-32GB", 32768),
    "V100-PCIE-32GB": Product("V100-32GB", 32768),
    "V100S-PCIE-32GB": Product("V100-32GB", 32768),
}

_PREFIXES = ("NVIDIA-", "TESLA-")
_MIG_SUFFIX_RE = re.compile(r"-MIG-(\d+G\.\d+GB(\+ME)?)$")
_INVALID_RE = re.compile(r"[^A-Za-z0-9.\-]+")
_warned: set[str] = set()


def _key(product: str) -> str:
    key = re.sub(r"[\s_]+", "-", product.strip()).upper()
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                changed = True
    return key


def split_mig_suffix(product: str) -> tuple[str, str | None]:
    """Split GPU Feature Discovery's single-strategy suffix: ``X-MIG-1g.10gb`` → (X, 1g.10gb)."""
    m = _MIG_SUFFIX_RE.search(product.upper())
    if m is None:
        return product, None
    return product[: m.start()], m.group(1).lower()


def lookup(product: str) -> Product | None:
    """The known product, or ``None``."""
    return _PRODUCTS.get(_key(product))


def model_name(product: str) -> str:
    """Our model name for a product; unknown products keep a sanitized name (and log once)."""
    known = lookup(product)
    if known is not None:
        return known.model
    name = _INVALID_RE.sub("-", _key(product)).strip("-.")
    name = re.sub(r"-{2,}", "-", name)[:63] or "UNKNOWN"
    if product not in _warned:
        _warned.add(product)
        log.warning(
            "unknown GPU product %r, using model name %r; add it to portal.inventory.products",
            product,
            name,
        )
    return name


def known_products() -> dict[str, Product]:
    """The mapping table (normalized product spelling → product), for docs and tests."""
    return dict(_PRODUCTS)
