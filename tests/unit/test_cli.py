"""The server's command line: help for every flag, Triton flags we ignore parsed in both spellings, unknown
options refused, --version."""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service import TRIREME_VERSION, TRITON_VERSION, version_text
from service.config.flags import build_parser, parse_args
from service.config.ignored_flags import IGNORED_TRITON_FLAGS
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


def test_bare_ignored_flag_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    flag = _ignored_actions(build_parser())[0].option_strings[0]
    with caplog.at_level(logging.WARNING, logger="trireme.config"):
        config = parse_args(["serve", flag, "--id", "me"])
    assert config.server_id == "me"
    assert [r.getMessage() for r in caplog.records] == [f"ignoring unsupported option '{flag}'"]


def _serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grpc-prot", "0"], "unrecognized option '--grpc-prot'; did you mean '--grpc-port'?"),
        (["--http-prot=0"], "unrecognized option '--http-prot'; did you mean '--http-port'?"),
        (["--allow-client-shmm=true"], "unrecognized option '--allow-client-shmm'; did you mean '--allow-client-shm'?"),
        (["--not-a-flag-anywhere", "5"], "unrecognized option '--not-a-flag-anywhere' ("),
        (["--id", "me", "stray"], "unexpected argument 'stray'"),
    ],
)
def test_unknown_option_is_refused_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_args(["serve", *argv])
    assert excinfo.value.code == 1
    assert message in capsys.readouterr().err


def test_a_typo_stops_the_server_before_it_listens() -> None:
    """A typo must not start a server on the defaults (issue 33): exit 1 as tritonserver, before any port opens."""
    out = _serve("serve", "--grpc-prot", "0")
    assert out.returncode == 1
    assert "unrecognized option '--grpc-prot'; did you mean '--grpc-port'?" in out.stderr
    assert "Started" not in out.stderr + out.stdout


# every option of tritonserver 2.73's parser (src/command_line_parser.cc): none may stop a Trireme server
TRITON_FLAGS = re.findall(
    r"\S+",
    """
help id exit-timeout-secs model-store model-repository exit-on-error disable-auto-complete-config strict-readiness
model-control-mode repository-poll-secs load-model model-config-name model-load-thread-count model-load-retry-count
model-namespacing enable-peer-access allow-http http-address http-port reuse-http-port http-header-forward-pattern
http-thread-count http-restricted-api allow-grpc grpc-address grpc-port reuse-grpc-port grpc-header-forward-pattern
grpc-infer-thread-count grpc-infer-allocation-pool-size grpc-max-response-pool-size grpc-use-ssl grpc-use-ssl-mutual
grpc-server-cert grpc-server-key grpc-root-cert grpc-infer-response-compression-level grpc-keepalive-time
grpc-keepalive-timeout grpc-keepalive-permit-without-calls grpc-http2-max-pings-without-data
grpc-http2-min-recv-ping-interval-without-data grpc-http2-max-ping-strikes grpc-max-connection-age
grpc-max-connection-age-grace grpc-restricted-protocol log-verbose log-info log-warning log-error log-format log-file
allow-sagemaker sagemaker-port sagemaker-safe-port-range sagemaker-thread-count allow-vertex-ai vertex-ai-port
vertex-ai-thread-count vertex-ai-default-model allow-metrics allow-gpu-metrics allow-cpu-metrics metrics-address
metrics-port metrics-interval-ms metrics-config trace-config cache-config cache-directory rate-limit
rate-limit-resource pinned-memory-pool-byte-size cuda-memory-pool-byte-size cuda-virtual-address-size
min-supported-compute-capability buffer-manager-thread-count host-policy model-load-gpu-limit backend-directory
backend-config repoagent-directory strict-model-config response-cache-byte-size trace-file trace-level trace-rate
trace-count trace-log-frequency allow-client-shm http-max-input-size
""",
)


def test_every_triton_flag_is_known() -> None:
    """Unknown options stop the server, so each of Triton's own must be a real flag or an accepted-and-ignored one."""
    known = set(build_parser()._option_string_actions)
    assert [f for f in TRITON_FLAGS if f"--{f}" not in known] == []


def test_version_prints_and_exits() -> None:
    for argv in (["--version"], ["serve", "--version"]):
        out = _serve(*argv)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == version_text()
        assert f"trireme {TRIREME_VERSION} " in out.stdout and TRITON_VERSION in out.stdout
        assert "Started" not in out.stderr


def test_package_version_matches_pyproject() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{TRIREME_VERSION}"' in text
    assert TRITON_VERSION == "2.73.0"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--grpc-infer-thread-count=1"],
            "invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128.",
        ),
        (["--grpc-infer-thread-count", "129"], "Must be in the range 2 to 128."),
        (["--grpc-max-response-pool-size=0"], "Error: --grpc-max-response-pool-size must be greater than 0."),
    ],
)
def test_grpc_pool_flags_validate_as_triton(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
    parse_args(["--grpc-infer-thread-count=128", "--grpc-max-response-pool-size", "1"])  # Triton's bounds pass


def test_ignored_flags_are_listed_in_the_docs() -> None:
    text = (ROOT / "docs" / "flags.md").read_text()
    missing = [flag for flag in IGNORED_TRITON_FLAGS if f"`{flag}`" not in text]
    assert missing == []
    section = text.split("## Triton flags that are accepted and ignored")[1].split("\n## ")[0]
    listed = re.findall(r"^\| `(--[a-z0-9-]+)` \|", section, re.M)
    assert [f for f in listed if f not in IGNORED_TRITON_FLAGS] == []  # a flag made real leaves the table


def test_example_repository_is_served_without_flags() -> None:
    config = parse_args([])
    assert config.using_example_repository
    assert Path(config.model_repositories[0]) == ROOT / "service" / "example_models"
    assert (Path(config.model_repositories[0]) / "add_sub" / "config.pbtxt").is_file()


def test_client_shm_is_off_by_default() -> None:
    assert parse_args([]).allow_client_shm is False
    assert parse_args(["--allow-client-shm=true"]).allow_client_shm is True


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
