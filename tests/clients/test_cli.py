import subprocess
import sys

from tierserve.clients.cli import main, version


def test_version_and_help(capsys):
    for argv in (["--version"], ["--help"]):
        try:
            main(argv)
        except SystemExit as exc:
            assert exc.code == 0
    out = capsys.readouterr().out
    assert f"tierserve {version()}" in out
    assert "usage: tierserve" in out and "demo" in out


def test_console_script_installed():
    result = subprocess.run(
        [sys.executable, "-m", "tierserve.clients.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == f"tierserve {version()}"
    assert version() != "0+unknown"
