"""Kubernetes resource quantities ("16Gi", "512M", "1.5e9") as numbers and back: memory growth and its caps."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Decimal("0.001"), "": Decimal(1), "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
            "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}
_NUMBER = r"[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SUFFIX = r"[KMGTPE]i|[mkMGTPE]|[eE][-+]?[0-9]+"
_FORM = re.compile(rf"^(?P<number>{_NUMBER})(?P<suffix>{_SUFFIX})?$")
# The same grammar as a plain pattern (JSON Schema has no named groups): a non-negative quantity.
QUANTITY_PATTERN = rf"^{_NUMBER}(?:{_SUFFIX})?$"
_MI = 2**20
_GI = 2**30


def quantity_bytes(quantity: str) -> int:
    """A memory quantity in bytes (rounded up, as the kubelet does); ValueError for a text that is none."""
    return math.ceil(quantity_value(quantity))


def quantity_value(quantity: str) -> Decimal:
    """A quantity's exact value ("500m" is 0.5 CPU, "16Gi" 16 * 2**30 bytes); ValueError for a text that is none."""
    match = _FORM.match(str(quantity).strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (such as 16Gi, 512Mi, 8G)")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as err:  # pragma: no cover - the pattern admits only numbers
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity") from err
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix[:1] in ("e", "E") and suffix not in _DECIMAL:
        value = number * Decimal(10) ** int(suffix[1:])
    else:
        value = number * _DECIMAL[suffix]
    return value


def format_memory(size: int) -> str:
    """Bytes as the quantity people write: whole Gi when it is one, else whole Mi (rounded up)."""
    if size % _GI == 0:
        return f"{size // _GI}Gi"
    return f"{math.ceil(size / _MI)}Mi"
