"""Policy tests import tools/ (ci, new_project, export_project) and repo_helpers directly."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tools")]
