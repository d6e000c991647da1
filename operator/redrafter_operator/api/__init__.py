"""The ReDrafterDeployment API (redrafter.dev/v1alpha1): typed spec and status, keys, the CRD."""

from .spec import ReDrafterDeploymentSpec, spec_errors
from .status import Condition, ReDrafterDeploymentStatus

GROUP = "redrafter.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ReDrafterDeployment"
PLURAL = "redrafterdeployments"
SINGULAR = "redrafterdeployment"
SHORT_NAMES = ["rdd"]
CRD_NAME = f"{PLURAL}.{GROUP}"

__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "Condition",
    "GROUP",
    "KIND",
    "PLURAL",
    "ReDrafterDeploymentSpec",
    "ReDrafterDeploymentStatus",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "spec_errors",
]
