#!/usr/bin/env bash
# Regenerates every table of docs/benchmarks.md, in the order of its sections, into one markdown file.
# Usage: bash tests/bench/run_all.sh [OUT.md]  (default benchmarks-<date>.md; needs tools/install-triton-tools.sh)
# Takes 1-2 hours on the 2-core VM; run it on a quiet machine: every table compares ratios within rounds.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-benchmarks-$(date +%Y%m%d-%H%M).md}
PY=.venv/bin/python
section() { printf '\n## %s\n\n' "$1" >>"$OUT"; }
run() { echo "+ $*" >&2; "$@" >>"$OUT" 2>>"$OUT.log" || echo "(failed: $*; see $OUT.log)" >>"$OUT"; }
echo "# Benchmarks regenerated $(date -u +%FT%TZ) on $(nproc) cores" >"$OUT"
section "CPU per request (instructions, CPU time, echo floor)"; run $PY tests/bench/bench_cpu.py --rounds 3
section "Worker path alone (instructions, one process)"; run $PY tests/bench/bench_worker_ir.py
section "Core path";                run $PY tests/bench/bench_core_vs_triton.py --rounds 3
section "Hot path (worker, in-process, inline vs Triton)"; run $PY tests/bench/bench_hotpath.py --rounds 3
section "Large messages (small requests while 100 MiB ones stream)"; run $PY tests/bench/bench_large.py --rounds 3
run $PY tests/bench/bench_large.py --rounds 3 --big-client process --loop-cost 0
run $PY tests/bench/bench_large.py --rounds 6 --big-client process --session both --small-rate 500 --loop-cost 0
run $PY tests/bench/large_stalls.py --rounds 3
section "Worker control channel";   run env PYTHONPATH=. $PY tests/bench/bench_ipc.py
section "Streaming (--streaming)";  run $PY tests/bench/bench_core_vs_triton.py --rounds 3 --concurrency 1 4 --extra-pa-args=--streaming
section "Shared memory";            run $PY tests/bench/bench_shm.py --rounds 3
section "Arenas that grow";         run $PY tests/bench/bench_arena_growth.py --size-mib 64 --rounds 3
section "Scheduler";                run $PY tests/bench/bench_batching.py --rounds 3
section "Framework backends";       run $PY tests/bench/bench_torch.py --rounds 3
section "Tree models (fil backend)"; run $PY tests/bench/bench_fil_engines.py; run $PY tests/bench/bench_fil.py --rounds 1
section "ONNX with and without OpenVINO"; run $PY tests/bench/bench_openvino.py --rounds 1
section "BLS";                      run $PY tests/bench/bench_bls.py --rounds 3
section "Metrics endpoint";         run $PY tests/bench/bench_metrics.py --pairs 20
section "Model changes under load"; run $PY tests/bench/bench_reload.py
section "HTTP/REST front end";      run $PY tests/bench/bench_http.py --rounds 3
run $PY tests/bench/bench_cpu.py --servers trireme triton --protocol http
run $PY tests/bench/bench_http_ir.py; run $PY tests/bench/bench_http_ir.py --split
run $PY tests/bench/bench_http_latency.py --rounds 3; run $PY tests/bench/bench_http_latency.py --rounds 3 --placement
section "Response cache";           run $PY tests/bench/bench_cache.py --rounds 3
section "Tracing";                  run $PY tests/bench/bench_trace.py --rounds 3
section "OpenAI API: batching";     run $PY tests/bench/bench_openai.py
section "Several front-end processes"; run $PY tests/bench/bench_frontends.py --rounds 3
run $PY tests/bench/bench_frontends.py --phases many --streaming --rounds 3
run $PY tests/bench/bench_frontend_tensors.py --rounds 2
section "gRPC transports";          run $PY tests/bench/bench_grpc_transports.py --rounds 3 --streaming
run $PY tests/bench/bench_cpu.py --servers echo trireme trireme_native --no-cpu
run $PY tests/bench/large_stalls.py --rounds 3 --grpc-transport native
section "Worker hop, core process and zero copy at 1 MiB"
run $PY tests/bench/bench_wakeup.py; run $PY tests/bench/bench_wakeup.py --cpus 0 0
run $PY tests/bench/bench_worker_channel.py
run $PY tests/bench/bench_shm_bookkeeping.py --ir
section "load/: trireme-perf vs perf_analyzer"
run $PY -m load crosscheck --server trireme -m identity_fp32 --concurrency 1,4 --rounds 5 -p 3000
echo "wrote $OUT" >&2
