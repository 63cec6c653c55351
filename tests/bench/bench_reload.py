"""Model changes under steady load: for each change, the requests served while it happened, the slowest request
that overlapped the switch, the time until the new model served, and failed or lost requests (must be 0).

Scenarios (a real Trireme server, 3 unary + 1 streaming client calling a Python model back to back):
explicit reload with a changed config, poll-mode change of model.py, a new version folder under
`latest { num_versions: 1 }`, instance count 1 -> 3 and 3 -> 1.
Usage: python tests/bench/bench_reload.py [--rounds N]   (prints a markdown table)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tritonclient.grpc as grpcclient  # noqa: E402

from tests.conftest import ServerProcess  # noqa: E402
from tests.steady_load import Outcome, SteadyLoad, tagged_config, tagged_model  # noqa: E402

MODEL = "tagged"


def _write(repo: Path, tag: float = 1, count: int = 1, param_tag: float = 0, version: int = 1) -> None:
    (repo / MODEL / str(version)).mkdir(parents=True, exist_ok=True)
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count, param_tag))
    (repo / MODEL / str(version) / "model.py").write_text(tagged_model(tag))


def _first_with(load: SteadyLoad, tag: float, after: float) -> float:
    while True:
        load.wait_answers(1)
        done = [o.done for o in list(load.outcomes) if o.value is not None and o.value[0] == tag and o.sent > after]
        if done:
            return min(done)


def _row(name: str, load: SteadyLoad, outcomes: list[Outcome], t0: float, t1: float) -> list[str]:
    window = [o for o in outcomes if o.value is not None and t0 <= o.done <= t1]
    overlapping = [o.done - o.sent for o in outcomes if o.sent <= t1 and o.done >= t0]
    before = [o.done - o.sent for o in outcomes if o.done < t0]
    return [
        name,
        f"{t1 - t0:.2f}",
        str(len(window)),
        f"{len(window) / (t1 - t0):.0f}",
        f"{statistics.median(before) * 1000:.1f}" if before else "-",
        f"{max(overlapping) * 1000:.0f}" if overlapping else "-",
        str(len(load.failures())),
        str(load.lost()),
    ]


def _scenario(
    name: str, mode_args: list[str], change: Callable[[Path, grpcclient.InferenceServerClient], float], tag: float
) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        if name.startswith("instances 3"):
            _write(repo, count=3)
        else:
            _write(repo)
        server = ServerProcess([repo], mode_args, Path(tmp) / "server.log")
        try:
            server.wait_ready()
            client = grpcclient.InferenceServerClient(server.url)
            load = SteadyLoad(server.url, MODEL).start()
            load.wait_answers(200)
            t0 = time.monotonic()
            t1 = change(repo, client)
            if tag:
                t1 = _first_with(load, tag, t0) if t1 == 0 else t1
            load.wait_answers(200)
            outcomes = load.stop()
            client.close()
            return _row(name, load, outcomes, t0, t1)
        finally:
            server.stop()


def _explicit_config(repo: Path, client: grpcclient.InferenceServerClient) -> float:
    (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, param_tag=10))
    client.load_model(MODEL)
    return time.monotonic()


def _poll_model_py(repo: Path, client: grpcclient.InferenceServerClient) -> float:
    (repo / MODEL / "1" / "model.py").write_text(tagged_model(2))
    return 0.0


def _poll_version(repo: Path, client: grpcclient.InferenceServerClient) -> float:
    _write(repo, tag=5, version=2)
    return 0.0


def _count(n: int) -> Callable[[Path, grpcclient.InferenceServerClient], float]:
    def change(repo: Path, client: grpcclient.InferenceServerClient) -> float:
        (repo / MODEL / "config.pbtxt").write_text(tagged_config(MODEL, count=n))
        client.load_model(MODEL)
        return time.monotonic()

    return change


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    explicit = ["--model-control-mode=explicit", f"--load-model={MODEL}"]
    poll = ["--model-control-mode=poll", "--repository-poll-secs=0.5"]
    scenarios = [
        ("explicit reload, changed config", explicit, _explicit_config, 0.0),
        ("poll: model.py changed", poll, _poll_model_py, 2.0),
        ("poll: version 2 added (latest 1)", poll, _poll_version, 5.0),
        ("instances 1 -> 3 (explicit)", explicit, _count(3), 0.0),
        ("instances 3 -> 1 (explicit)", explicit, _count(1), 0.0),
    ]
    print(
        "| change | time to new model (s) | requests served meanwhile | per s | p50 before (ms) "
        "| max latency across the switch (ms) | failed | lost |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for _ in range(args.rounds):
        for name, mode, change, tag in scenarios:
            print("| " + " | ".join(_scenario(name, mode, change, tag)) + " |", flush=True)


if __name__ == "__main__":
    main()
