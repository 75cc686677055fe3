"""The ``training.kubernetes`` section of a spec: how the train task's pods are built.

Owned by the Kubernetes launcher (issue 4); extended there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class KubernetesSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    image: str = Field(description="Trainer image (see trainer_image/README.md).", examples=["ghcr.io/trainpipe/trainer:0.1.0"])
    namespace: str = Field(default="default", description="Namespace of the training pods.", examples=["ml-training"])
