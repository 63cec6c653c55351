"""The server's command line: help for every flag, Triton flags we ignore parsed in both spellings."""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from service.config.flags import IGNORED_TRITON_FLAGS, build_parser, parse_args
from service.examples import missing_example_lines

ROOT = Path(__file__).resolve().parents[2]


def _ignored_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if any(o in IGNORED_TRITON_FLAGS for o in a.option_strings)]


def test_every_flag_has_help_text() -> None:
    parser = build_parser()
    missing = [a.option_strings for a in parser._actions if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_serve_help_describes_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    for action in build_parser()._actions:
        for option in action.option_strings:
            assert option in out.stdout
        first_words = " ".join(str(action.help).split()[:3])
        assert first_words in " ".join(out.stdout.split()), action.option_strings


def test_ignored_flags_parse_with_space_and_equals(caplog: pytest.LogCaptureFixture) -> None:
    actions = _ignored_actions(build_parser())
    assert actions, "no ignored Triton flag left to test"
    for action in actions:
        flag = action.option_strings[0]
        for argv in ([flag, "7", "--grpc-port", "9"], [f"{flag}=7", "--grpc-port", "9"]):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="trireme.config"):
                config = parse_args(argv)
            assert config.grpc_port == 9
            assert [r.getMessage() for r in caplog.records] == [f"ignoring unsupported option '{flag}=7'"]


def test_bare_ignored_flag_and_unknown_flags(caplog: pytest.LogCaptureFixture) -> None:
    flag = _ignored_actions(build_parser())[0].option_strings[0]
    with caplog.at_level(logging.WARNING, logger="trireme.config"):
        config = parse_args(["serve", flag, "--not-a-flag-anywhere", "5", "--other-unknown=x", "--id", "me"])
    assert config.server_id == "me"
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring unsupported option '{flag}'",
        "ignoring unsupported option '--not-a-flag-anywhere=5'",
        "ignoring unsupported option '--other-unknown=x'",
    ]


def test_real_flags_still_validate() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--exit-on-error", "maybe"])
    config = parse_args(["--exit-on-error=false", "--strict-model-config", "true", "--model-store", "/m"])
    assert (config.exit_on_error, config.auto_complete, config.model_repositories) == (False, False, ["/m"])


def test_missing_generated_example_is_explained(tmp_path: Path) -> None:
    lines = missing_example_lines(str(tmp_path))
    assert len(lines) == 1
    assert "fc_model_pt" in lines[0]
    assert "make_example_models.py" in lines[0] or "torch" in lines[0]
    (tmp_path / "fc_model_pt" / "1").mkdir(parents=True)
    (tmp_path / "fc_model_pt" / "1" / "model.pt").write_bytes(b"x")
    try:
        import torch  # noqa: F401
    except ImportError:
        assert "needs torch" in missing_example_lines(str(tmp_path))[0]
    else:
        assert missing_example_lines(str(tmp_path)) == []
