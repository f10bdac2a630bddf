"""Which of the measured kernel implementations each engine runs.

aiconfigurator-core measures an operator under several implementations (its ``kernel_source`` column: a
table of vLLM's block-FP8 GEMMs holds DeepGEMM's, CUTLASS's and FlashInfer's), and names them per
framework (SGLang's FA3 attention is ``fa3``, vLLM's is ``vllm_flash_attn_fa3``). A step is priced by
the implementation the engine picks by default, each choice below read from the engine's own source
(docs/simulator.md, "Which kernels each engine runs"). Every list is an order of preference: the first
one measured for the queried shape is used, else the first measured in name order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from vocab.model import ENGINE_NAMES

# the MoE backends vLLM's --moe-backend names that the simulator prices (auto: vLLM's own choice
# where it is priced, else the nearest table's kernels)
VLLM_MOE_BACKENDS = ("auto", "triton", "flashinfer_trtllm", "flashinfer_cutlass")


@dataclass(frozen=True)
class Lanes:
    framework: str  # the tables' folder: sglang or vllm
    # the fused-MoE implementation, in preference order
    moe: tuple[str, ...]
    # GEMM implementation per weight dtype (an absent dtype: one implementation measured)
    gemm: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # attention implementation per backend name the simulator resolves (fa3, triton, flashinfer,
    # trtllm_mha); an absent name is looked up as it is
    attention: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # implementations whose rows are not read (each says why below): the next recorded version that
    # measured the operator stands in, then SGLang's measurement of it
    distrusted: frozenset[str] = frozenset()
    # the fused-MoE implementation the engine was told to run (weight dtype, its MoE-backend flag): looked
    # for in every recorded version of the table before the nearest version's ``moe`` preference (an
    # empty answer: none named)
    moe_runs: Callable[[str, str], tuple[str, ...]] | None = None

    @property
    def engine(self) -> str:
        return ENGINE_NAMES[self.framework]

    def attention_sources(self, backend: str) -> tuple[str, ...]:
        return self.attention.get(backend, (backend,))

    def allreduce_backend(self, graph: bool) -> str:
        """The all-reduce table's ``backend``: the engine's custom all-reduce replayed from a CUDA graph
        or launched eagerly."""
        return f"{self.framework}_{'graph' if graph else 'eager'}"


# vLLM's FlashInfer backend on Blackwell runs TensorRT-LLM's prefill and decode kernels; tables of
# 0.22 carry one label for the backend
_VLLM_FLASHINFER = ("vllm_flashinfer_trtllmprefill", "vllm_flashinfer_trtllmdecode", "vllm_flashinfer")

# vLLM's fused-MoE implementations by the tables' names; Triton's is SGLang's fused_moe_triton too (the
# kernel SGLang took from vLLM), which stands in where no vLLM table of the GPU measured it
_VLLM_TRITON_MOE = ("vllm_fused_moe", "vllm_fp8moe_triton_tritonexperts",
                    "vllm_unquantizedfusedmoe_triton_tritonexperts", "sglang_fused_moe_triton")
_VLLM_FI_TRTLLM_FP8 = ("vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmonolithic",
                       "vllm_fp8moe_flashinfer_trtllm_trtllmfp8expertsmodular")
_VLLM_FI_CUTLASS_FP8 = ("vllm_fp8moe_flashinfer_cutlass_flashinferexperts",)


def _vllm_moe_runs(dtype: str, backend: str) -> tuple[str, ...]:
    """The block-FP8 expert kernels ``--moe-backend`` names (as the environment variables that switch
    FlashInfer and DeepGEMM off do: VLLM_USE_FLASHINFER_MOE_FP8=0 with VLLM_MOE_USE_DEEP_GEMM=0 leaves
    Triton's), looked for in every recorded version; none for ``auto``, which prices the nearest version's
    own implementation. The simulated vLLM names the kernels of vLLM's own choice itself where it prices
    them (``PlayedRelease.fp8_moe_backend``)."""
    if dtype != "fp8_block":
        return ()
    named = {"triton": _VLLM_TRITON_MOE, "flashinfer_trtllm": _VLLM_FI_TRTLLM_FP8,
             "flashinfer_cutlass": _VLLM_FI_CUTLASS_FP8}
    return named.get(backend, ())


LANES = {
    # SGLang's fused MoE is its Triton kernel unless a backend is asked for; every GEMM dtype has one
    # implementation in its tables; attention tables are labelled with SGLang's backend names
    "sglang": Lanes("sglang", moe=("sglang_fused_moe_triton",)),
    "vllm": Lanes(
        "vllm",
        # Triton's fused MoE (``fused_moe`` in 0.19's tables, split per quantization in 0.24's): vLLM's
        # default on Hopper; the FlashInfer ones need VLLM_USE_FLASHINFER_MOE_* set
        moe=_VLLM_TRITON_MOE,
        moe_runs=_vllm_moe_runs,
        # block-FP8 linear layers run DeepGEMM where it is installed (VLLM_USE_DEEP_GEMM defaults to 1;
        # vLLM's images ship it)
        gemm={"fp8_block": ("DeepGemmFp8BlockScaledMMKernel",)},
        distrusted=frozenset({
            # vLLM's block-FP8 GEMM rows time its linear method eagerly, activation quantization and
            # Python dispatch included: DeepGEMM's 70-85 us at every token count up to 1,024 on H100 and
            # H200 (SGLang's rows of the same kernel: 9-14 us), FlashInfer's 60 us from one token,
            # CUTLASS's never under 150 us, Triton's (L40S) never under 280 us. A decode step replays a
            # CUDA graph, which has no host time: SGLang's measurement of the kernel prices it
            "DeepGemmFp8BlockScaledMMKernel", "FlashInferFp8BlockScaledMMKernel",
            "CutlassFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel",
            # 0.19's INT4 (Marlin) MoE rows are 2.4 times slower (median of the 324 shapes both measured;
            # never less than 1.25 times) than 0.24's rows of the same Marlin kernel on H200 and B200,
            # which agree with SGLang's Marlin rows: a collection that did not time the kernel vLLM runs
            "vllm_marlin_int4_moe"}),
        # vLLM's backend priority (platforms/cuda.py): FLASH_ATTN first below compute capability 10, which
        # is FlashAttention 3 on Hopper; FLASHINFER first on Blackwell. The simulator resolves fa3 on
        # Hopper and trtllm_mha (SGLang's default) on Blackwell: each names vLLM's default there
        attention={"fa3": ("vllm_flash_attn_fa3",), "triton": ("vllm_triton_attn",),
                   "flashinfer": _VLLM_FLASHINFER, "trtllm_mha": _VLLM_FLASHINFER},
    ),
}

