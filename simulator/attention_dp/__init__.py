"""Attention data parallelism inside one engine (SGLang's ``--attn-dp-size``, before 0.5.22
``--enable-dp-attention`` with ``--dp-size``): the TP group's GPUs split into ranks that each run their own
scheduler, requests and KV cache for the attention blocks, and meet at every MLP and MoE layer, where all
ranks' tokens go through the experts together (gathered, or dispatched and combined by an all-to-all
backend such as DeepEP).

- ``layout.py``: the resolved layout (ranks, each rank's attention TP, the MoE backend and its mode, EPLB,
  redundant experts) and what it does to a GPU's memory: dense weights replicated per rank, KV of a
  rank's own requests only;
- ``costs.py``: one lockstep forward of every rank's batch, priced from the step costs: the slowest
  rank's attention, the experts over every rank's tokens, the gathers or the all-to-all around them.

The ranks' schedulers, advanced together with an idle rank running a padded batch, are
``simulator/lockstep.py`` (beside ``replica.py``, whose schedulers they are).

docs/simulator.md, "Attention data parallelism", says what is modelled and what is not.
"""
