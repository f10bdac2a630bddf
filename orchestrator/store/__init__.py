"""The MLflow store and what keeps it whole: the tracker a trial logs through (``tracking``), the spool that
keeps what could not be logged (``spool``) and its later upload (``sync``), and the runs a killed process
left behind (``stale``). Secrets are kept out of what it writes by ``orchestrator.redact``, which stays
outside the package: the engines' launchers use it too, and the store depends on them."""
