"""Which source prices a simulated step's kernels: the roofline or the measured tables.

``--sim-step-costs`` (the orchestrator's ``simulator.step_costs``):

- ``roofline``: the formula in ``costs.py`` (efficiencies of peak bandwidth and compute, a kernel floor);
- ``measured``: ``measured_costs.py``, from the kernel tables of the GPU the hardware profile names in
  ``kernel_tables`` (an ``aiconfigurator-core`` system); refused when the profile names none or the
  package is not installed;
- ``auto`` (default): measured where the profile names a table set and the package is installed, else
  the roofline, with the reason; a roofline box whose profile names ``collective_tables`` (a measured
  system of its GPU generation and bus) has its TP all-reduce priced from that system's table
  (``borrowed_collectives.py``).

Whatever the choice, :class:`StepCosts` says what priced the run: it goes into ``/server_info``
(``sim_step_costs``), and from there into every run's tags and description.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packaging.version import Version

from simulator import SGLANG_COMPAT_VERSION
from simulator.borrowed_collectives import MeasuredAllreduce, measured_by
from simulator.costs import CostModel
from simulator.kernel_tables import KernelTables, kernel_tables, package_version, systems_dir, table_sets
from simulator.measured_costs import Coverage, MeasuredCosts

MODES = ("auto", "roofline", "measured")


class StepCostsError(ValueError):
    """``--sim-step-costs`` cannot be honoured; the message is one line."""


@dataclass
class StepCosts:
    """What priced a simulated run's kernels, for its records."""

    mode: str  # as asked: auto | roofline | measured
    source: str  # what priced it: roofline | measured
    tables: str = ""  # "aiconfigurator-core 0.12.0: rtx_pro_6000_server, SGLang 0.5.14" (measured)
    why: str = ""  # why the roofline under auto
    # roofline with the TP all-reduce measured on another system: what measured it
    # ("aiconfigurator-core 0.12.0: l40s, vLLM 0.22.0"); "" where the formula prices it
    collectives: str = ""
    # measured: what priced each operator (the roofline ones, and queries outside the measured range,
    # are added as the run meets them)
    coverage: Coverage = field(default_factory=Coverage)

    def fallbacks(self) -> list[str]:
        """Operators the roofline priced in a measured run, and why."""
        return self.coverage.fallbacks()

    def label(self) -> str:
        """One line: "measured (aiconfigurator-core 0.12.0: h100_sxm, SGLang 0.5.14)" or "roofline (why)"."""
        if self.source == "measured":
            return f"measured ({self.tables})"
        base = f"roofline ({self.why})" if self.why else "roofline"
        return f"{base}; TP all-reduce measured ({self.collectives})" if self.collectives else base

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "source": self.source, "tables": self.tables, "why": self.why,
                "collectives": self.collectives, "label": self.label(), "fallbacks": self.fallbacks()}


def unavailable(table_set: str | None) -> str:
    """Why measured tables cannot price this run, or "" when they can."""
    if not table_set:
        return "the hardware profile names no kernel table set (hardware.kernel_tables)"
    if systems_dir() is None:
        return "aiconfigurator-core is not installed (Linux x86-64 only)"
    if table_set not in table_sets():
        return (f"aiconfigurator-core {package_version()} has no tables for {table_set!r}; it has "
                f"{', '.join(table_sets())}")
    return ""


def describe_step_costs(mode: str, table_set: str | None, launched: str = SGLANG_COMPAT_VERSION,
                        framework: str = "sglang", collective_tables: str | None = None) -> StepCosts:
    """What ``mode`` chooses for a hardware profile naming ``table_set`` (tables of the engine
    ``framework`` at its version ``launched``: by default SGLang's, at the version the simulator follows)
    and ``collective_tables``, without building a model: the label every run, prediction and finding
    carries."""
    if mode not in MODES:
        raise StepCostsError(f"--sim-step-costs {mode!r}: valid: {', '.join(MODES)}")
    if mode == "roofline":
        return StepCosts(mode, "roofline", why="asked for")
    why = unavailable(table_set)
    if why:
        if mode == "measured":
            raise StepCostsError(f"--sim-step-costs measured: {why}; valid here: auto or roofline")
        borrowed = (measured_by(collective_tables, launched, framework)
                    if collective_tables and not unavailable(collective_tables) else "")
        return StepCosts(mode, "roofline", why=why, collectives=borrowed)
    assert table_set is not None
    measured_with = _measured_with(kernel_tables(table_set, launched, framework))
    return StepCosts(mode, "measured",
                     tables=f"aiconfigurator-core {package_version()}: {table_set}, {measured_with}")


def _measured_with(tables: KernelTables) -> str:
    """"SGLang 0.5.14", "vLLM 0.19.0/0.24.0 (SGLang 0.5.14 for mla)": the engine versions the tables were
    measured with, the engine's own, then SGLang's where it stands in (and for which families)."""
    own = tables.lanes.engine
    versions: dict[str, set[str]] = {}
    families: dict[str, set[str]] = {}
    for table, measured in tables.versions().items():
        engine, version = measured.split(" ", 1)
        versions.setdefault(engine, set()).add(version)
        families.setdefault(engine, set()).add(table.split("/")[0])

    def listed(engine: str) -> str:
        return f"{engine} {'/'.join(sorted(versions[engine], key=Version))}"

    others = [f"{listed(e)} for {', '.join(sorted(families[e]))}" for e in sorted(versions) if e != own]
    mine = listed(own) if own in versions else own
    return f"{mine} ({'; '.join(others)})" if others else mine


def apply_step_costs(mode: str, cost: CostModel, table_set: str | None, launched: str,
                     attention_backend: str, fuse_shared_experts: bool = True, framework: str = "sglang",
                     moe_backend: str = "auto", collective_tables: str | None = None) -> StepCosts:
    """Set ``cost``'s step-cost source as ``mode`` asks and say what priced it. ``fuse_shared_experts``:
    SGLang's default of folding DeepSeek-V3's shared expert into the routed experts' kernel (off with
    ``--disable-shared-experts-fusion``). ``framework``, ``launched``: the engine the simulator plays and
    its version, whose tables price the step; ``moe_backend``: the MoE kernels it was told to run;
    ``collective_tables``: the measured system whose all-reduce prices a roofline box's TP group."""
    chosen = describe_step_costs(mode, table_set, launched, framework, collective_tables)
    if chosen.source == "measured":
        assert table_set is not None
        source = MeasuredCosts(cost, kernel_tables(table_set, launched, framework, moe_backend),
                               attention_backend, fuse_shared_experts)
        cost.use_source(source)
        chosen.coverage = source.coverage
    elif chosen.collectives and collective_tables and cost.par.tp > 1:
        borrowed = MeasuredAllreduce(collective_tables, launched, framework, cost.par.tp)
        if borrowed.measured:
            cost.use_collectives(borrowed)
        else:  # a TP size the other system did not measure: the formula's, said so
            chosen.collectives = ""
    return chosen
