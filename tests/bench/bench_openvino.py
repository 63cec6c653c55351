"""Benchmark: one ONNX MLP (3 x Gemm 512 + Relu, FP32 [512]) on ONNX Runtime's CPU provider, with the
`openvino` cpu_execution_accelerator, and as an OpenVINO IR on the openvino backend; real perf_analyzer.

Usage: .venv/bin/python tests/bench/bench_openvino.py [--rounds 2] [--stability "-p 2000 -s 30 -r 8"]
Needs onnx, onnxruntime and perf_analyzer; the IR row needs the `openvino` package. Which OpenVINO route the
accelerator takes depends on what is installed (docs/backends.md#openvino): with the `openvino` package the
OpenVINO runtime compiles the ONNX model, with onnxruntime-openvino it is ONNX Runtime's OpenVINOExecutionProvider.

Each model: one CPU instance, one inference thread, `dynamic_batching {}`. The server runs with
--model-control-mode=explicit so that each load is timed alone and its worker's RSS is known. Per round, per
model: perf_analyzer at concurrency 1 and 8 (batch 1 per request).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.servers import free_port, perf_analyzer, rounds_and_attempts, start_trireme, stop, wait_started  # noqa: E402

WIDTH = 512
IO = f"""\
max_batch_size: 32
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
dynamic_batching {{ }}
"""
THREADS = 'parameters {{ key: "{key}" value: {{ string_value: "1" }} }}\n'
ACCEL = 'optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "openvino" } ] } }\n'


def write_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        w = (rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(WIDTH, np.float32), f"b{i}")]
        out = "y" if i == 2 else f"h{i}"
        nodes += [
            helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [f"g{i}"]),
            helper.make_node("Relu", [f"g{i}"], [out]),
        ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def write_repo(repo: Path) -> list[str]:
    models = {
        "onnx_cpu": 'platform: "onnxruntime_onnx"\n' + IO + THREADS.format(key="intra_op_thread_count"),
        "onnx_openvino": 'platform: "onnxruntime_onnx"\n' + IO + THREADS.format(key="intra_op_thread_count") + ACCEL,
    }
    for name, text in models.items():
        write_onnx(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(text)
    try:
        import openvino as ov
    except ImportError:
        return list(models)
    (repo / "ov_ir" / "1").mkdir(parents=True)
    ir = ov.convert_model(str(repo / "onnx_cpu" / "1" / "model.onnx"))
    ov.save_model(ir, str(repo / "ov_ir" / "1" / "model.xml"), compress_to_fp16=False)
    (repo / "ov_ir" / "config.pbtxt").write_text(
        'backend: "openvino"\n' + IO + THREADS.format(key="INFERENCE_NUM_THREADS")
    )
    return [*models, "ov_ir"]


def main() -> None:
    args, attempts = rounds_and_attempts(__doc__)
    import onnxruntime
    import tritonclient.grpc as grpcclient

    res: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        names = write_repo(repo)
        port = free_port()
        log = Path(tmp) / "server.log"
        proc = start_trireme(repo, port, log, extra_args=["--model-control-mode=explicit"])
        wait_started(proc, log)
        workers: dict[str, int] = {}
        try:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            for name in names:
                known = set(psutil.Process(proc.pid).children())
                t0 = time.perf_counter()
                client.load_model(name)
                res.setdefault(name, {})["load_s"] = [time.perf_counter() - t0]
                (worker,) = set(psutil.Process(proc.pid).children()) - known
                workers[name] = worker.pid
            for rnd in range(args.rounds):
                for name in names:
                    for c in (1, 8):
                        row = perf_analyzer(name, port, c, attempts, Path(tmp) / "pa.csv")
                        res[name].setdefault(f"ips{c}", []).append(float(row["Inferences/Second"]))
                        res[name].setdefault(f"p50_{c}", []).append(float(row["p50 latency"]))
                sys.stderr.write(f"round {rnd + 1}/{args.rounds} done\n")
            for name, pid in workers.items():
                res[name]["rss"] = [psutil.Process(pid).memory_info().rss / 2**20]
                maps = Path(f"/proc/{pid}/maps").read_text()
                res[name]["ov"] = [float("libopenvino" in maps)]
            client.close()
        finally:
            stop([proc])
    print(f"\n## ONNX MLP 3x{WIDTH}: CPU provider vs OpenVINO (onnxruntime {onnxruntime.__version__}, providers "
          f"{', '.join(onnxruntime.get_available_providers())})\n")  # fmt: skip
    print("| model | infer/s c=1 | p50 us c=1 | infer/s c=8 | p50 us c=8 | worker RSS MiB | load s | OpenVINO loaded |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in res.items():
        m = {k: statistics.median(v) for k, v in r.items()}
        print(
            f"| {name} | {m['ips1']:.0f} | {m['p50_1']:.0f} | {m['ips8']:.0f} | {m['p50_8']:.0f} | {m['rss']:.0f} | "
            f"{m['load_s']:.2f} | {'yes' if m['ov'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
