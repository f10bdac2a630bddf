"""A trial's load points: what each one sends (``plan``: the points, their request spec, their lengths)
and how a closed loop's streams enter (``ramp``). A package of its own, not inside ``orchestrator.trial``:
the predictions (``orchestrator.prediction``), which a trial uses, build their points the same way."""
