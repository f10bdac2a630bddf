"""What differs between the vLLM releases the simulated engine plays, read from each release's wheel
(``vllm/config/scheduler.py``, ``vllm/engine/arg_utils.py``, ``vllm/v1/metrics/loggers.py``,
``vllm/v1/core/kv_cache_utils.py``, ``vllm/logger.py``); the releases are those parasweep records."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

PLAYED = ("0.11.2", "0.12.0", "0.15.1", "0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.34.0")
NEWEST = PLAYED[-1]

# compute capability of each GPU by aiconfigurator-core's system names (those the fused all-reduce
# rule below tells apart)
CAPABILITY = {"h100_sxm": 90, "h200_sxm": 90, "b200_sxm": 100, "b300_sxm": 103}
# FI_ALLREDUCE_FUSION_MAX_SIZE_MB (compilation/passes/fusion/allreduce_rms_fusion.py): the largest
# all-reduce input, per capability and TP size, that the fused all-reduce takes; 0.16 and 0.18 hold the
# same table (0.17 is read as theirs), 0.19 adds compute capability 10.3, 0.34 raises its 8-GPU size
_FUSED_MAX_MB = {
    "0.17": {90: {2: 64, 4: 2, 8: 0.5}, 100: {2: 64, 4: 32, 8: 1}},
    "0.19": {90: {2: 64, 4: 2, 8: 0.5}, 100: {2: 64, 4: 32, 8: 1}, 103: {2: 64, 4: 64, 8: 2}},
    "0.34": {90: {2: 64, 4: 2, 8: 0.5}, 100: {2: 64, 4: 32, 8: 1}, 103: {2: 64, 4: 64, 8: 4}},
}


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
    def spec_widens_capture(self) -> bool:
        """The default largest CUDA-graph capture counts a verify step's k + 1 tokens per request
        (``VllmConfig._set_cudagraph_sizes``: min(2 x max_num_seqs x (1 + k), 512) from 0.15; before,
        min(2 x max_num_seqs, 512) whatever the speculation)."""
        return self._v >= Version("0.15")

    @property
    def reserve_full_prompt(self) -> bool:
        """``scheduler_reserve_full_isl`` (0.19 on, default True): a waiting request is admitted only when
        its whole prompt fits in the free KV blocks, not only its first chunk."""
        return self._v >= Version("0.19")

    def fp8_moe_backend(self, system: str) -> str:
        """The expert kernels ``--moe-backend auto`` prices for block-FP8 experts. vLLM's FP8 MoE oracle
        (``fused_moe/oracle/fp8.py``, from 0.17) puts FlashInfer's TensorRT-LLM kernels first where they run
        (Blackwell): priced so. On Hopper it prefers Triton's for tensor parallelism and FlashInfer's
        CUTLASS kernels with expert parallelism; priced from the CUTLASS table, the Hopper runs with
        experts spread were predicted worse in both TTFT and TPOT, so ``auto`` stays with the nearest
        table's own kernels there (docs/simulator.md, "vLLM's own choice of block-FP8 expert kernels").
        Before 0.17 FlashInfer's were opt-in: the nearest table's own."""
        if self._v >= Version("0.17") and CAPABILITY.get(system, 0) >= 100:
            return "flashinfer_trtllm"
        return "auto"

    def fused_allreduce_bytes(self, system: str, tp: int, asked: bool | None) -> int:
        """The largest TP all-reduce (bytes) the compilation fuses with the RMSNorm after it into
        FlashInfer's all-reduce, where the compilation config asks for ``fuse_allreduce_rms`` (0: none):
        the release's size limit for the GPU and TP size (0.17's before 0.17). vLLM turns the fusion on
        by default from 0.17 (O2's ``enable_allreduce_rms_fusion``: TP > 1 on compute capability 9.0 or
        10.x, FlashInfer installed, up to 0.19 no DP or PP); that default is not priced: priced from
        TensorRT-LLM's table it predicted the served runs worse than the custom all-reduce's
        (docs/simulator.md, "vLLM fuses its TP all-reduces from 0.17")."""
        if not asked or tp < 2:
            return 0
        key = "0.34" if self._v >= Version("0.34") else "0.19" if self._v >= Version("0.19") else "0.17"
        mb = _FUSED_MAX_MB[key].get(CAPABILITY.get(system, 0), {}).get(tp)
        return int(mb * 2**20) if mb else 0

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
