"""Prefill/decode disaggregation in the discrete-event model: the simulated engine in either role.

SGLang's flow, as the simulated servers play it (docs/disaggregation.md has the sources):

* the router sends each request to a prefill server and a decode server at once;
* the decode server pre-allocates KV for the whole prompt once its memory allows (``decode_role.py``:
  the reserve of ``--num-reserved-decode-tokens`` per active request) and tells the prefill server;
* the prefill server computes nothing for a request before that (SGLang's ``early`` policy): its
  bootstrap queue holds it (``prefill_role.py``). Then it prefills in chunks, sends each chunk's KV after
  the chunk's forward, samples the first token with the last chunk, and frees the request's KV only when
  the whole transfer has completed;
* the transfer (``kv_transfer.py``) takes the prompt's KV bytes per GPU over the path between the two
  servers (the GPUs' link within a node, the network across nodes) plus the path's one-message latency,
  one transfer after another on each GPU's link;
* the decode server, at its next scheduler iteration after the transfer, streams the first token the
  prefill server sampled (SGLang's "prebuilt" batch) and decodes the rest with the others.

``deployment.py`` puts prefill and decode servers on one virtual clock (predictions:
``simulator/predict_disagg.py``); the live servers (one process each) exchange the same two messages over
the prefill server's bootstrap port (``live.py``).
"""
