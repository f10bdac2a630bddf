"""The shared vocabulary: the words every other package speaks, importing none of them.

* :mod:`vocab.load`: load points and request specs (what a load point sends, and when);
* :mod:`vocab.records`: per-request records and a load point's result;
* :mod:`vocab.metric_keys`: the grammar of every metric key (``c8/output_tok_s``, ``pred/...``);
* :mod:`vocab.status`: run kinds, trial statuses and tag names;
* :mod:`vocab.findings`: a diagnosis finding;
* :mod:`vocab.hardware`, :mod:`vocab.model`: hardware profiles and the one ``config.json`` reader;
* :mod:`vocab.assets`: where the shipped configs and models are installed;
* :mod:`vocab.telemetry`: GPU and per-stage series, the engine's GPU layout, summary names;
* :mod:`vocab.store`: where the default MLflow store is (``runs/mlflow.db`` under the cwd).
"""
