"""The architecture holds: imports point down the layers, and no package has import cycles.

The contracts are in pyproject.toml (`[tool.importlinter]`); the layers are the
README's layout table, top to bottom.
"""

import os
import subprocess
import sys

REPO = os.path.join(os.path.dirname(__file__), "..")


def test_import_contracts_hold():
  # `python -c` from the repository: the checked code is this checkout's.
  command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
  result = subprocess.run([sys.executable, "-c", command], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
  assert "2 kept, 0 broken" in result.stdout
