"""Pure builders: (resource, facts) -> the Kubernetes manifests the operator creates.

Which children exist at which point of a resource's life is the controller's planner's decision;
``redrafter-operator render`` prints them through the planner (``controller/preview.py``).
"""
