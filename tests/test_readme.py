"""README's two commands exist near the top, and CI runs README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    text = (ROOT / "README.md").read_text()
    head = text[: text.index("## ")]
    return re.findall(r"```bash\n(.+?)\n```", head, flags=re.S)


def test_readme_has_exactly_two_commands_near_the_top():
    cmds = _commands()
    assert len(cmds) == 2, cmds
    assert "pip install" in cmds[0] and "python -m harness run" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = _commands()[1].strip()
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert lines[-1] == test_cmd
    assert "torch==2.13.0" in ci and "triton==3.6.0" in ci
