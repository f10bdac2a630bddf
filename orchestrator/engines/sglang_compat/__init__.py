"""SGLang version differences: flag spellings per version, the installed version and its flag set,
and the preflight that refuses a flag the target version does not accept (docs/sglang-adapter.md)."""

from orchestrator.engines.launch_args import Arg, args_to_argv
from orchestrator.engines.sglang_compat.command import build_args, check_args, decode_log_interval
from orchestrator.engines.sglang_compat.detect import SGLangTarget, flags_from_help, resolve_target
from orchestrator.engines.sglang_compat.versions import (
    NEWEST_KNOWN,
    FlagSet,
    parse_version,
    recorded_flag_set,
    spelling,
)

__all__ = [
    "NEWEST_KNOWN",
    "Arg",
    "FlagSet",
    "SGLangTarget",
    "args_to_argv",
    "build_args",
    "check_args",
    "decode_log_interval",
    "flags_from_help",
    "parse_version",
    "recorded_flag_set",
    "resolve_target",
    "spelling",
]
