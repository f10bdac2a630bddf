"""How a run is classified in the tracking store: its kind, its status, and the tag names that say so.

Every module that reads or writes these tags uses the names here, so a search for a tag finds every
place that touches it.
"""

from __future__ import annotations

from enum import StrEnum


class RunKind(StrEnum):
    SWEEP = "sweep"  # the parent run of a sweep
    TRIAL = "trial"  # one measured trial (a child run)
    PREDICTION = "prediction"  # one trial predicted in virtual time (predict=true)


class TrialStatus(StrEnum):
    RUNNING = "running"  # only while the trial runs; a run left so was killed outright
    OK = "ok"
    FAILED = "failed"
    KILLED = "killed"  # interrupted (Ctrl-C, SIGTERM, a cancelled Ray task)
    SKIPPED = "skipped"  # not run: reused from an earlier trial with the same config hash

    @property
    def succeeded(self) -> bool:
        return self in (TrialStatus.OK, TrialStatus.SKIPPED)


# The engine tags (Tag.ENGINE) whose numbers the simulator made: the simulated engine playing SGLang
# ("sim") or vLLM ("sim-vllm"), and its model in virtual time ("sim-predict"). Any other tag is a real
# engine, measured.
SIMULATED_ENGINES = ("sim", "sim-vllm", "sim-predict")
# the simulated engines that serve over HTTP, and the engine each plays
PLAYS = {"sim": "sglang", "sim-vllm": "vllm"}


def simulated(engine: str) -> bool:
    """Whether the engine tag ``engine`` names the simulator (its numbers are not measured)."""
    return engine in SIMULATED_ENGINES


# the value of Tag.EXPERIMENT_KIND for parasweep's experiments: the UI's model-training view (runs,
# params, metrics, charts); MLflow's UI also knows "genai_development" and "finetuning"
EXPERIMENT_KIND = "custom_model_development"


class Tag:
    """Tag names (``parasweep.*``) of sweep and trial runs."""

    KIND = "parasweep.kind"
    STATUS = "parasweep.status"
    MODE = "parasweep.mode"  # sweep runs: measure | prediction | search
    SEARCH = "parasweep.search"  # a search's run: the search's name (search.name)
    SEARCH_SOURCE = "parasweep.search_source"  # where the search's candidate numbers come from
    ENGINE = "parasweep.engine"
    ENGINE_REASON = "parasweep.engine_reason"  # why that engine: engine=auto's choice, or the config's
    ENGINE_VERSION = "parasweep.engine_version"
    # a simulated engine played faster or slower than real time (engine.time_scale): "4" for four of its
    # seconds per wall second; its trial was measured on its own clock, every time and rate in its seconds
    SIM_TIME_SCALE = "parasweep.sim_time_scale"
    CONFIG_HASH = "parasweep.config_hash"
    TRIAL_NUM = "parasweep.trial_num"
    OVERRIDES = "parasweep.overrides"  # what varies between the sweep's trials
    TRIAL_DIR = "parasweep.trial_dir"
    GIT_SHA = "parasweep.git_sha"
    ERROR = "parasweep.error"
    CUDA_VISIBLE_DEVICES = "parasweep.cuda_visible_devices"
    # where the trial ran, to trace a result to its hardware (orchestrator/environment.py: placement)
    HOST = "parasweep.host"
    RAY_NODE_ID = "parasweep.ray_node_id"
    GPU_UUIDS = "parasweep.gpu_uuids"
    COMMAND = "parasweep.command"
    SWEEP_DIR = "parasweep.sweep_dir"
    STARTED = "parasweep.started"
    REUSED_RUN_ID = "parasweep.reused_run_id"
    REPRODUCES = "parasweep.reproduces"
    REPRODUCE_WARNING = "parasweep.reproduce_warning"
    REPRODUCE_DIFF = "parasweep.reproduce_diff"  # one line: largest metric changes, environment differences
    # what priced the simulator's steps (the simulated engine, predict=true, pred/ metrics, predicted
    # effects): "measured (aiconfigurator-core <version>: <gpu table set>, SGLang <version>)" or
    # "roofline (why)"
    STEP_COSTS = "parasweep.step_costs"
    # how far the simulator's predictions for such a configuration are from published measurements: the
    # model's median error on the corpus's runs of its family ("±24 % (median) on 12 published dense
    # runs"; docs/fidelity.md)
    PREDICTION_ERROR = "parasweep.prediction_error"
    # predicted points (virtual time) that ran their whole budget (workload.predicted.budget_s) before
    # their throughput and p99s were known to workload.predicted.ci_target: "c64,c128"
    BUDGET_HIT = "parasweep.budget_hit"
    # real traffic (workload.source other than random): what was read, what is sent, what was skipped,
    # and which tokenizer made ids of text
    TRAFFIC = "parasweep.traffic"
    GPU_TELEMETRY = "parasweep.gpu_telemetry"  # nvml | simulated | none: where GPU numbers come from
    GPU_TELEMETRY_NOTE = "parasweep.gpu_telemetry_note"  # what was sampled, or why nothing was
    # the process that started the run: a run left "running" whose driver is gone was killed outright
    # (same host, and that pid no longer runs or now runs a process started at another time)
    DRIVER_HOST = "parasweep.driver_host"
    DRIVER_PID_NAMESPACE = "parasweep.driver_pid_namespace"  # containers may share a host name
    DRIVER_PID = "parasweep.driver_pid"
    DRIVER_STARTED = "parasweep.driver_started"  # the driver process's start, epoch seconds
    STALE_CLOSED = "parasweep.stale_closed"  # why a later run closed this one: its driver was gone
    # every run parasweep creates carries the id it had before the tracking server answered: a sync
    # interrupted after creating a run (or a creation whose answer was lost) finds that run again
    # instead of creating a twin
    SPOOL_ID = "parasweep.spool_id"
    NOTE = "mlflow.note.content"  # the run description the MLflow UI shows
    # experiment tag: which view the MLflow UI opens an experiment (or a link to one of its runs) in.
    # Without it MLflow 3 guesses, and a run link opened directly landed in "GenAI / Evaluations".
    EXPERIMENT_KIND = "mlflow.experimentKind"
    PARENT = "mlflow.parentRunId"


# environment.placement's keys, each with the tag that records it
PLACEMENT_TAGS = {"host": Tag.HOST, "ray_node_id": Tag.RAY_NODE_ID, "gpu_uuids": Tag.GPU_UUIDS}
