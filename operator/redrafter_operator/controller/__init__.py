"""The operator's controller, top to bottom (each module imports only those below it; see
tests/unit/test_import_layers.py):

* ``main`` wires the process: ``redrafter-operator run``, gated by ``leader`` (Lease election); ``handlers`` is the kopf shell (indexes, event
  handlers, startup); ``reconciler`` holds the state, the workers and the reconcile of one resource.
* ``speculation`` and ``validation`` are the evaluators (policy/autoscaler, validation gate); ``observe``
  turns the indexes into the planner's facts.
* ``planner`` is one pure plan step: ``engines`` (builds), ``targets`` (serving targets, blue/green),
  ``status`` (conditions, phase, Events), ``routing`` (the InferencePool beside the Service), ``gate`` (the
  validation gate's rules).
* ``resource_io`` is the I/O the reconciler and the evaluators share; ``apply`` the Kubernetes client;
  ``plan_types``, ``facts`` and ``conditions`` are plain values.
"""
