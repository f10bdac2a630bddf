"""The options the installed vLLM's own server parser accepts, as JSON: what ``scripts/vllm_facts.py``'s
static reading of the same release is checked against (tests/data/vllm/flags-<version>-imported.json).

    python -m venv /tmp/v && /tmp/v/bin/pip install vllm==0.19.0
    /tmp/v/bin/python scripts/vllm_imported_flags.py tests/data/vllm/flags-0.19.0-imported.json

It builds the parser ``vllm serve`` builds (``make_arg_parser``) and writes, per option string, its
argparse dest, whether it takes a value (a ``BooleanOptionalAction`` or ``store_true`` takes none,
``nargs="?"`` an optional one) and its choices. On a machine without a GPU vLLM cannot name a device,
and one config's default (``DeviceConfig``) refuses to be built without one; the platform is told
"cpu" first, which changes no option. The JSON goes to the file named (vLLM logs to standard output).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm import __version__, platforms

platforms.current_platform.device_type = "cpu"  # no GPU here: the default DeviceConfig needs a device name

from vllm.entrypoints.openai.cli_args import make_arg_parser  # noqa: E402

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # before 0.12
    from vllm.utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
flags: dict[str, dict] = {}
for action in parser._actions:
    for option in action.option_strings:
        if option in ("-h", "--help"):
            continue
        takes: bool | str = action.nargs != 0 and not isinstance(action, argparse.BooleanOptionalAction)
        if action.nargs == "?":
            takes = "optional"
        flags[option] = {"dest": action.dest, "value": takes,
                         "choices": sorted(map(str, action.choices)) if action.choices else []}
out = {"vllm_version": __version__, "flags": flags}
Path(sys.argv[1]).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
