"""The operator's controller, top to bottom (each module imports only those below it; see
tests/unit/test_import_layers.py):

* ``main`` wires the process: ``redrafter-operator run``, gated by ``leader`` (Lease election); ``handlers`` is the kopf shell (indexes, event
  handlers, startup); ``reconciler`` holds the state, the workers and the reconcile of one resource.
* ``speculation`` and ``retention`` are the monitors (the policy/autoscaler on pod metrics; the engine cache's
  collection children per claim): periodic, they write nothing and hand the reconciler typed reports;
  ``observe`` turns the indexes into the planner's facts.
* ``planner`` is one pure plan step: ``engines`` (builds), ``validation`` (the validation Job and its verdict),
  ``targets`` (serving targets, blue/green), ``status`` (conditions, phase, Events), ``routing`` (the
  InferencePool beside the Service), ``gate`` (the promotion gate's rules); ``preview`` runs it for `render`.
* ``resource_io`` is what the reconciler and the monitors share; ``apply`` the Kubernetes client; ``clock``
  the one injectable clock; ``plan_types``, ``facts`` and ``conditions`` are plain values.
"""
