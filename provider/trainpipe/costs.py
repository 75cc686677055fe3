"""What training costs: device-hours from wall time, and money from the platform's price table.

Airflow-free and MLflow-free: plain arithmetic the train task, ``register`` and ``trainpipe cost``
share. The price table is platform input, never spec input: it is read from the ``costs:`` mapping
of the YAML file named by ``TRAINPIPE_POLICY`` (the platform policy file), with ``yaml.safe_load``.

    costs:
      gpu_hour: {default: 2.5, nvidia.com/gpu: 3.0, amd.com/gpu: 2.0}
      cpu_hour: 0.04
      spot_discount: 0.7     # a spot run pays 30% of the price

A run's cost = (gpu_hours x the price of its GPU resource + cpu_hours x cpu_hour) x (1 - spot_discount
when its pods are placed on spot capacity only).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainpipe.errors import TrainpipeError

# MLflow metric names on the training run (and tag names on the registered version): exact, the issue names them.
GPU_HOURS = "gpu_hours"
CPU_HOURS = "cpu_hours"
COST = "cost"
USAGE_KEYS = (GPU_HOURS, CPU_HOURS, COST)
POLICY_ENV = "TRAINPIPE_POLICY"
DEFAULT_GPU_PRICE = "default"


class PolicyError(TrainpipeError, ValueError):
    """The platform policy file (its ``costs:`` mapping) is unreadable or malformed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """Prices per device-hour in the table's currency unit; ``spot_discount`` is the fraction a spot run saves."""

    # GPU resource name (``nvidia.com/gpu``) or ``default`` -> price of one GPU-hour.
    gpu_hour: dict[str, float] = field(default_factory=dict)
    cpu_hour: float = 0.0
    spot_discount: float = 0.0

    def gpu_price(self, gpu_resource: str | None) -> float | None:
        if gpu_resource and gpu_resource in self.gpu_hour:
            return self.gpu_hour[gpu_resource]
        return self.gpu_hour.get(DEFAULT_GPU_PRICE)

    def cost(self, *, gpu_hours: float, cpu_hours: float, gpu_resource: str | None, spot: bool) -> float | None:
        """The money, or None when GPUs were used and the table has no price for them (nor a default)."""
        gpu_price = self.gpu_price(gpu_resource)
        if gpu_hours > 0 and gpu_price is None:
            return None
        total = gpu_hours * (gpu_price or 0.0) + cpu_hours * self.cpu_hour
        return total * (1.0 - self.spot_discount) if spot else total


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PolicyError(f"{where}: must be a number >= 0 (a price per hour), got {value!r}")
    return float(value)


def price_table_from_mapping(costs: Any, *, source: str) -> PriceTable:
    """The ``costs:`` mapping of the policy -> a ``PriceTable``; a ``PolicyError`` names the field and the fix."""
    if not isinstance(costs, dict):
        raise PolicyError(f"{source}: costs: must be a mapping with gpu_hour, cpu_hour, spot_discount, "
                          f"got {type(costs).__name__}")
    unknown = sorted(set(costs) - {"gpu_hour", "cpu_hour", "spot_discount"})
    if unknown:
        raise PolicyError(f"{source}: costs: unknown key(s) {', '.join(map(str, unknown))}; "
                          "allowed: gpu_hour, cpu_hour, spot_discount")
    gpu = costs.get("gpu_hour", {})
    if isinstance(gpu, int | float) and not isinstance(gpu, bool):
        gpu = {DEFAULT_GPU_PRICE: gpu}  # one price for every GPU
    if not isinstance(gpu, dict):
        raise PolicyError(f"{source}: costs.gpu_hour: must be a mapping {{default: PRICE, <gpu resource>: PRICE}}, "
                          f"got {gpu!r}")
    gpu_hour = {str(name): _price(value, f"{source}: costs.gpu_hour.{name}") for name, value in gpu.items()}
    discount = costs.get("spot_discount", 0.0)
    if isinstance(discount, bool) or not isinstance(discount, int | float) or not 0 <= discount < 1:
        raise PolicyError(f"{source}: costs.spot_discount: must be a fraction in [0, 1) (0.7: spot costs 30% of the "
                          f"price), got {discount!r}")
    return PriceTable(gpu_hour=gpu_hour, cpu_hour=_price(costs.get("cpu_hour", 0.0), f"{source}: costs.cpu_hour"),
                      spot_discount=float(discount))


def load_price_table(path: str | os.PathLike[str] | None = None) -> PriceTable | None:
    """The price table of the policy file (``path``, else ``$TRAINPIPE_POLICY``); None without a file or
    without a ``costs:`` mapping in it (then runs record device-hours but no money)."""
    import yaml

    path = path or os.environ.get(POLICY_ENV)
    if not path:
        return None
    source = Path(path).name
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise PolicyError(f"{POLICY_ENV}: cannot read the policy file {source} ({err.strerror}); "
                          "set it to a readable YAML file or unset it") from err
    except yaml.YAMLError as err:
        raise PolicyError(f"{source}: not valid YAML ({err}); fix the file") from err
    if document is None:
        return None
    if not isinstance(document, dict):
        raise PolicyError(f"{source}: the policy must be a mapping at the top level")
    if document.get("costs") is None:
        return None
    return price_table_from_mapping(document["costs"], source=source)


# Node labels that place a pod on spot (preemptible) capacity, with the value meaning spot.
SPOT_NODE_LABELS: dict[str, str] = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}


def selects_spot_only(node_selector: dict[str, str], required: list[dict[str, Any]] | tuple = ()) -> bool:
    """Whether the pods can run on spot capacity only (a node selector or a required affinity term
    naming a spot label); preferred terms do not count: such pods may land on on-demand nodes."""
    for key, value in node_selector.items():
        if SPOT_NODE_LABELS.get(key) == value:
            return True
    for term in required:
        values = list(term.get("values") or ())
        if term.get("operator", "In") == "In" and values and all(SPOT_NODE_LABELS.get(term.get("key")) == v
                                                                 for v in values):
            return True
    return False


def cpu_quantity(quantity: str) -> float:
    """A Kubernetes CPU quantity ("500m", "2", "1.5") as cores."""
    text = str(quantity).strip()
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)


def format_usage(gpu_hours: float, cpu_hours: float, cost: float | None) -> str:
    """One short human line: ``0.50 GPU-hours, 2.00 CPU-hours, cost 1.25``."""
    text = f"{gpu_hours:.3g} GPU-hours, {cpu_hours:.3g} CPU-hours"
    return f"{text}, cost {cost:.2f}" if cost is not None else f"{text} (no price table: no cost)"
