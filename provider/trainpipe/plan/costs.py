"""What training costs: device-hours from wall time, and money from the platform's price table.

Airflow-free and MLflow-free: plain arithmetic the train task, ``register`` and ``trainpipe cost``
share. The price table is platform input, never spec input: it is read from the ``costs:`` mapping
of the YAML file named by ``TRAINPIPE_POLICY`` (the platform policy file), with ``yaml.safe_load``.

    costs:
      gpu_hour: {default: 2.5, nvidia.com/gpu: 3.0, amd.com/gpu: 2.0}
      cpu_hour: 0.04
      spot_discount: 0.7     # a spot run pays 30% of the price

A run's cost = (gpu_hours x the price of its GPU resource + cpu_hours x cpu_hour) x (1 - spot_discount
when its pods are placed on spot capacity only), summed over its tries: a run whose last tries fell back
to on-demand capacity (``training.kubernetes.capacity``) pays the spot price for its spot tries only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# MLflow metric names on the training run (and tag names on the registered version): exact, the issue names them.
GPU_HOURS = "gpu_hours"
CPU_HOURS = "cpu_hours"
COST = "cost"
# The GPU-hours of the tries on spot capacity and on on-demand capacity (gpu_hours is their sum).
SPOT_GPU_HOURS = "spot_gpu_hours"
ON_DEMAND_GPU_HOURS = "on_demand_gpu_hours"
USAGE_KEYS = (GPU_HOURS, CPU_HOURS, COST, SPOT_GPU_HOURS, ON_DEMAND_GPU_HOURS)
DEFAULT_GPU_PRICE = "default"


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


# Node labels that place a pod on spot (preemptible) capacity, with the value meaning spot.
SPOT_NODE_LABELS: dict[str, str] = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}


def selects_spot_only(node_selector: dict[str, str], required: Sequence[Mapping[str, Any]] = ()) -> bool:
    """Whether the pods can run on spot capacity only (a node selector or a required affinity term
    naming a spot label); preferred terms do not count: such pods may land on on-demand nodes."""
    for key, value in node_selector.items():
        if SPOT_NODE_LABELS.get(key) == value:
            return True
    for term in required:
        values = list(term.get("values") or ())
        if term.get("operator", "In") == "In" and values and all(SPOT_NODE_LABELS.get(term.get("key", "")) == v
                                                                 for v in values):
            return True
    return False


def format_usage(gpu_hours: float, cpu_hours: float, cost: float | None) -> str:
    """One short human line: ``0.50 GPU-hours, 2.00 CPU-hours, cost 1.25``."""
    text = f"{gpu_hours:.3g} GPU-hours, {cpu_hours:.3g} CPU-hours"
    return f"{text}, cost {cost:.2f}" if cost is not None else f"{text} (no price table: no cost)"
