"""redrafter-operator: ReDrafter speculative decoding on Kubernetes."""

__version__ = "0.1.0"
