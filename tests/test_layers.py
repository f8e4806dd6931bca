"""What ``lint-imports`` cannot see: the CLI builds its parser without importing Ray."""

from __future__ import annotations

import subprocess
import sys

_CODE = """
import sys
from asymvlm.cli import build_parser
build_parser().format_help()
assert not [m for m in sys.modules if m.split('.')[0] in ('ray', 'pipelines')]
"""


def test_the_cli_parser_imports_no_ray() -> None:
    done = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
