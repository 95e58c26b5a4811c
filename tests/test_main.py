"""The command line's entry point (``python -m harness``, ``attn-harness``: harness.cli.entry)."""

import subprocess
import sys
from pathlib import Path

import harness.cli as cli

ROOT = Path(__file__).resolve().parents[1]


def test_ctrl_c_at_the_top_level_is_one_line_and_exit_130(monkeypatch, capsys):
    """Interrupted where no command handles it (start-up's imports, a command without a report): exit status 130
    and one line on stderr, no traceback."""

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    assert cli.entry() == 130
    assert capsys.readouterr().err == "python -m harness: interrupted (Ctrl-C)\n"


def test_python_dash_m_harness_goes_through_the_entry_point():
    out = subprocess.run([sys.executable, "-m", "harness", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "Reference test harness" in out.stdout
    assert "from harness.cli import entry" in (ROOT / "harness" / "__main__.py").read_text()
