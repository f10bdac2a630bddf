"""The draft model's numbers: what one draft forward reads and computes, from its ``config.json``.

- EAGLE-3 heads (``LlamaForCausalLMEagle3``): one decoder layer whose attention projections read the
  token's embedding beside the fused hidden state (twice the hidden width in), an ``fc`` fusing three
  of the target's hidden states (three times the target's hidden width in), and an LM head over the
  draft's own reduced vocabulary (``draft_vocab_size``). The embedding is the target's (shared).
- EAGLE (EAGLE-2) heads: one decoder layer over ``fc`` of the embedding and the target's last hidden
  state (twice the hidden width in); embedding and LM head are the target's (shared, read again).
- MTP (``NEXTN``): the target's own next-token layers (``num_nextn_predict_layers``, DeepSeek-V3: one MoE
  layer), with ``eh_proj`` fusing embedding and hidden state, and the target's full-vocabulary head.
- STANDALONE: a whole small model, as its config describes it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from simulator.model_spec import ModelSpec, load_model_spec, spec_from_config
from vocab.model import ModelConfigError, language_config, mtp_layers, read_config_json


def _fused_input(spec: ModelSpec, params: int) -> ModelSpec:
    """``spec`` with ``params`` more parameters read by every token (the fusing projections), counted
    with the attention projections, which every token reads at the same precision."""
    return dataclasses.replace(spec, attn_params=spec.attn_params + params)


def draft_spec(algorithm: str, draft_path: str, target: ModelSpec, context_length: int) -> ModelSpec:
    """The draft model of ``algorithm`` (EAGLE, EAGLE3, STANDALONE) at ``draft_path``; for a target that
    carries its own MTP layers, ``draft_path`` is the target's own folder."""
    cfg = read_config_json(Path(draft_path))
    arch = (language_config(cfg).get("architectures") or ["?"])[0]
    if draft_path == target.path or (arch == target.architecture and mtp_layers(cfg)):
        return _mtp_spec(cfg, target, context_length)
    spec = load_model_spec(draft_path, context_length)
    if algorithm == "STANDALONE":
        return spec
    h = spec.hidden
    q_kv_width = (spec.num_heads + 2 * spec.num_kv_heads) * spec.qk_head_dim
    if algorithm == "EAGLE3":
        target_hidden = int(cfg.get("target_hidden_size") or target.hidden)
        draft_vocab = int(cfg.get("draft_vocab_size") or spec.vocab)
        # q/k/v read [embedding, fused hidden] (2h in, h more than a plain layer); fc: 3 target hiddens -> h
        spec = _fused_input(spec, h * q_kv_width + 3 * target_hidden * h)
        return dataclasses.replace(spec, lm_head_params=draft_vocab * h, vocab=draft_vocab)
    # EAGLE-2: fc over [embedding, hidden] (2h -> h); head shared with the target
    return _fused_input(spec, 2 * h * h)


def _mtp_spec(cfg: dict, target: ModelSpec, context_length: int) -> ModelSpec:
    layers = mtp_layers(cfg)
    if layers < 1:
        raise ModelConfigError(f"{target.name} has no MTP layers (num_nextn_predict_layers is "
                               f"{cfg.get('num_nextn_predict_layers')}): give an EAGLE-3 draft instead")
    own = dict(cfg)
    # the MTP block is one decoder layer like the target's MoE layers; first_k_dense_replace would make it
    # dense
    own.update(num_hidden_layers=layers, first_k_dense_replace=0)
    spec = spec_from_config(own, name=f"{target.name}-mtp", path=target.path, context_length=context_length)
    return _fused_input(spec, 2 * spec.hidden * spec.hidden)  # eh_proj: [embedding, hidden] -> hidden
