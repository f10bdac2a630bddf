"""An older release's defaults, for replaying a run measured on it: read from the release's own
server_args.py and cuda_graph_runner.py (orchestrator/fidelity/releases.py), applied only where the
published launch set nothing."""

from __future__ import annotations

from packaging.version import Version

from orchestrator.fidelity.releases import release, release_defaults

# GPU memory as NVML reports it, in MiB: the H200's from the real samples in tests/data/nvml/ (its README);
# the H100 80GB's as nvidia-smi prints it on an H100 SXM (81,559 MiB). Only which side of 0.4.5's 80 GiB
# threshold each lies on matters to the defaults.
H100_MIB = 81559.0
H200_MIB = 143771.0


def test_the_release_is_read_from_the_published_text() -> None:
    assert release("~0.4.0 (docker lmsysorg/sglang:latest, Dec 2024; not pinned)") == Version("0.4.0")
    assert release("main @ 2024-10-21 (~0.3.4)") == Version("0.3.4")
    assert release("0.4.5.post3") == Version("0.4.5.post3")
    assert release(">=0.5.7") == Version("0.5.7")
    assert release("main") is None and release(None) is None


def test_newer_releases_and_unknown_ones_change_nothing() -> None:
    assert release_defaults(">=0.5.7", {}, 8, H200_MIB) == ([], [])
    assert release_defaults("0.5.3.post3", {}, 1, H100_MIB) == ([], [])
    assert release_defaults("main", {}, 1, H100_MIB) == ([], [])


def test_0_3_0_had_no_overlap_scheduler_and_its_own_memory_fraction() -> None:
    flags, notes = release_defaults("0.3.0", {}, 4, H100_MIB)
    assert flags == ["--mem-fraction-static", "0.85", "--chunked-prefill-size", "8192",
                     "--cuda-graph-max-bs-decode", "160", "--disable-overlap-schedule"]
    assert notes == ["SGLang 0.3.0's defaults where the launch set none: mem_fraction_static 0.85, "
                     "chunked_prefill_size 8192, CUDA graphs to batch 160, no overlap scheduler"]
    # TP8 took 0.83 before 0.4 and 0.81 from it; 0.2 had no chunked prefill
    assert release_defaults("0.3.4", {}, 8, H100_MIB)[0][:2] == ["--mem-fraction-static", "0.83"]
    assert release_defaults("0.4.0", {}, 8, H100_MIB)[0][:2] == ["--mem-fraction-static", "0.81"]
    assert release_defaults("0.2.12", {}, 1, H100_MIB)[0][2:4] == ["--chunked-prefill-size", "-1"]


def test_what_the_launch_set_is_kept_and_the_overlap_scheduler_follows_the_release() -> None:
    flags, _ = release_defaults("0.3.0", {"mem_fraction_static": 0.88, "chunked_prefill_size": 4096}, 4,
                                H100_MIB)
    assert flags == ["--cuda-graph-max-bs-decode", "160", "--disable-overlap-schedule"]
    # 0.3.x had it off unless asked for; 0.4 on unless turned off
    assert "--disable-overlap-schedule" not in release_defaults(
        "0.3.4", {"enable_overlap_schedule": True}, 1, H100_MIB)[0]
    assert "--disable-overlap-schedule" not in release_defaults("0.4.0", {}, 4, H100_MIB)[0]
    assert "--disable-overlap-schedule" in release_defaults("0.4.9", {"overlap_schedule": False}, 4,
                                                            H100_MIB)[0]


def test_from_0_4_5_a_large_gpu_keeps_all_but_13_gib() -> None:
    flags, _ = release_defaults("0.4.5.post3", {}, 8, H200_MIB)
    assert flags[:2] == ["--mem-fraction-static", f"{round((H200_MIB - 13 * 1024) / H200_MIB, 3):g}"]
    assert release_defaults("0.4.5.post3", {}, 8, H100_MIB)[0][:2] == ["--mem-fraction-static", "0.81"]
