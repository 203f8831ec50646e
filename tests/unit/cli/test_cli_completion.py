"""``rooftop completion bash|zsh``: scripts written from the parsers, that complete."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_process import Rooftop


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the last of ``words`` after sourcing ``script``."""
    line = " ".join(words)
    words_array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({words_array}); COMP_CWORD={len(words) - 1}; "
        f"COMP_LINE='{line}'; COMP_POINT={len(line)}; "
        f"_shtab_rooftop rooftop '{words[-1]}' '{words[-2]}'; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_choices(rooftop: Rooftop, tmp_path: Path) -> None:
    done = rooftop("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "rooftop.bash"
    script.write_text(done.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert _complete(script, "rooftop", "pr") == ["predict"]
    assert _complete(script, "rooftop", "predict", "--model") == ["--model", "--model-config"]
    assert _complete(script, "rooftop", "plan", "x.yaml", "-o", "") == [
        "text", "table", "wide", "json", "yaml"
    ]  # fmt: skip
    assert "completion" in _complete(script, "rooftop", "")


def test_zsh_script_is_a_compdef_for_every_command(rooftop: Rooftop, tmp_path: Path) -> None:
    done = rooftop("completion", "zsh")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#compdef rooftop")
    for word in ("plan", "predict", "render", "simulate", "--model-config", "--output"):
        assert word in done.stdout
    if shutil.which("zsh"):
        script = tmp_path / "_rooftop"
        script.write_text(done.stdout)
        assert subprocess.run(["zsh", "-n", str(script)]).returncode == 0


def test_an_unknown_shell_exits_2(rooftop: Rooftop) -> None:
    done = rooftop("completion", "fish")
    assert done.returncode == 2 and "invalid choice" in done.stderr
