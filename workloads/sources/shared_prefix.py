"""Generated prompts that share prefixes: SGLang's generated-shared-prefix workload.

``groups`` system prompts, each the same ``system_len`` ids in every request of its group (drawn from the
seed and the group), followed by a question of ``question_len`` ids of the request's own (drawn from the
seed and the request's index), asking for ``output_len`` tokens. A pass of ``groups × prompts_per_group``
requests sends each group's questions once, the whole pass in a seeded shuffle; with ``zipf`` each
request draws its group (group k with weight 1 / (k + 1) ** zipf). What a prefix cache can save is then
known from first principles: every request after its group's first reuses ``system_len`` tokens.
"""

from __future__ import annotations

import numpy as np

from vocab.load import Source

from .base import SourceRequest, SourceRequests


class SharedPrefixRequests(SourceRequests):
    def __init__(self, source: Source, seed: int, vocab_size: int) -> None:
        super().__init__(source, seed, vocab_size)
        shape = source.shared_prefix
        self.shape = shape
        self.count = shape.groups * shape.prompts_per_group
        rng = np.random.default_rng([seed, 29])
        if shape.zipf is None:
            in_order = np.repeat(np.arange(shape.groups), shape.prompts_per_group)
            self.group_of = in_order[rng.permutation(self.count)]
        else:
            weights = 1.0 / np.arange(1, shape.groups + 1) ** shape.zipf
            self.group_of = rng.choice(shape.groups, size=self.count, p=weights / weights.sum())
        popularity = "" if shape.zipf is None else f", groups drawn with Zipf exponent {shape.zipf:g}"
        self.read = (f"generated shared prefixes: {shape.groups} groups × {shape.prompts_per_group} prompts, "
                     f"{shape.system_len}-token system prompt + {shape.question_len}-token question, "
                     f"{shape.output_len} tokens out{popularity}")
        self._systems: dict[int, np.ndarray] = {}

    def group(self, i: int) -> int:
        """Request ``i``'s group (a request past one pass repeats the pass)."""
        return int(self.group_of[i % self.count])

    def request(self, i: int) -> SourceRequest:
        g = self.group(i)
        system = self._systems.get(g)
        if system is None:
            system = np.random.default_rng([self.seed, 19, g]).integers(
                0, self.vocab_size, self.shape.system_len)
            self._systems[g] = system
        question = np.random.default_rng([self.seed, 23, i % self.count]).integers(
            0, self.vocab_size, self.shape.question_len)
        return SourceRequest(np.concatenate((system, question)), self.shape.output_len)
