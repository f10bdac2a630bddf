"""What differs between the vLLM releases the simulated engine plays, read from each release's wheel
(``vllm/config/scheduler.py``, ``vllm/engine/arg_utils.py``, ``vllm/v1/metrics/loggers.py``,
``vllm/v1/core/kv_cache_utils.py``, ``vllm/logger.py``); the releases are those parasweep records."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

PLAYED = ("0.11.2", "0.12.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.34.0")
NEWEST = PLAYED[-1]


@dataclass(frozen=True)
class PlayedRelease:
    version: str

    @property
    def _v(self) -> Version:
        return Version(self.version)

    @property
    def async_scheduling_default(self) -> bool:
        """``SchedulerConfig.async_scheduling``: False up to 0.12; from 0.15 None, which start-up turns on
        where nothing forbids it (a speculative method it does not support, an executor without it)."""
        return self._v >= Version("0.15")

    @property
    def reserve_full_prompt(self) -> bool:
        """``scheduler_reserve_full_isl`` (0.19 on, default True): a waiting request is admitted only when
        its whole prompt fits in the free KV blocks, not only its first chunk."""
        return self._v >= Version("0.19")

    @property
    def kv_usage_label(self) -> str:
        """The stats line's KV field: ``GPU KV cache usage`` (a literal up to 0.19, ``%s KV cache usage``
        with the device's name, GPU on CUDA, in 0.34)."""
        return "GPU KV cache usage"

    @property
    def hit_rate_always(self) -> bool:
        """The stats line carries ``Prefix cache hit rate`` even before any lookup (up to 0.19); 0.34
        leaves it out until the cache has been queried."""
        return self._v < Version("0.34")


def played(version: str | None) -> PlayedRelease:
    """The release ``version`` names (the newest where None); ValueError for one not played."""
    chosen = version or NEWEST
    if chosen not in PLAYED:
        raise ValueError(
            f"vLLM {chosen} is not a release the simulated engine plays; valid: {', '.join(PLAYED)}"
        )
    return PlayedRelease(chosen)


def default_caps(gpu_memory_gb: float, gpu_name: str) -> tuple[int, int]:
    """(``--max-num-seqs``, ``--max-num-batched-tokens``) where unset, for ``vllm serve`` (the OpenAI
    server's usage context): 1024 and 8192 on a GPU of at least 70 GiB that is not an A100, else 256 and
    2048 (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``, the same in every played
    release)."""
    large = gpu_memory_gb * 1e9 >= 70 * 2**30 and "a100" not in gpu_name.lower()
    return (1024, 8192) if large else (256, 2048)
