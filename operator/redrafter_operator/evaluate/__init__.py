"""Evaluation of a ReDrafter deployment against its base engine, and validation before promotion.

* :mod:`.loadgen` drives an endpoint's entry model with closed-loop streaming load (also used by the
  demo, whose target concurrency changes while it runs);
* :mod:`.sweep` runs a concurrency sweep against one or two endpoints;
* :mod:`.stats` turns per-request measurements into percentiles, tokens/s, acceptance and the
  measured crossover concurrency (pure);
* :mod:`.report` writes the JSON and the self-contained markdown/HTML report with plots;
* :mod:`.validate` checks a new engine pair before the Service points at it;
* :mod:`.outcome` is the validation Job's termination-message format the controller parses (pure,
  importable without tritonclient).

Only :mod:`.stream`, :mod:`.loadgen`, :mod:`.sweep` and :mod:`.validate` need ``tritonclient``
(the ``client`` extra); everything else is importable by the operator itself.
"""
