"""The PodSecurity admission plugin, as the emulated API server runs it on Pod creation.

The rules are the operator package's (:mod:`redrafter_operator.render.podsecurity`): one implementation,
which ``redrafter-operator check`` also runs on the pods the operator will create.
"""

from __future__ import annotations

from redrafter_operator.render.podsecurity import (
    ENFORCE_LABEL,
    ENFORCE_VERSION_LABEL,
    LEVELS,
    admit_pod,
    namespace_policy,
    violations,
)

__all__ = ["ENFORCE_LABEL", "ENFORCE_VERSION_LABEL", "LEVELS", "admit_pod", "namespace_policy", "violations"]
