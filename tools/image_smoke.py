"""Smoke test of a built Trireme image: start it with a model repository mounted, infer with tritonclient, stop it.

    python tools/image_smoke.py --engine podman --image localhost/trireme:cpu --model-repository DIR

Runs the image with `<engine> run`; where the engine cannot start containers (some sandboxes refuse the OCI
runtime), runs it by `podman image mount` + chroot in a private mount namespace with /proc, /dev and a /dev/shm
tmpfs of --shm-size, as the image's user and with the image's environment and entrypoint. Prints the start time
(process start to gRPC ready) and each check; exits 1 when a check fails. tools/build-image.sh calls this.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    """A started image: how to watch and stop it, its log file, and the host ports of gRPC and HTTP."""

    log_path: Path
    grpc_port: int
    http_port: int
    metrics_port: int
    how: str
    proc: subprocess.Popen[bytes] | None = None  # chroot: the server process itself
    container: str = ""  # engine run: the container's name
    engine: str = ""
    root: str = ""  # chroot: the mounted image
    config: dict | None = None  # chroot: the image's Config

    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def exit_code(self) -> int | None:
        """The server's exit status, None while it runs."""
        if self.proc is not None:
            return self.proc.poll()
        out = subprocess.run(
            [self.engine, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", self.container],
            capture_output=True,
            text=True,
        ).stdout.split()
        return None if not out or out[0] == "true" else int(out[1])

    def user(self) -> str:
        """The server's user id inside the container."""
        if self.proc is not None:
            status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
            return next(x for x in status if x.startswith("Uid:")).split()[1]
        return subprocess.run(
            [self.engine, "exec", self.container, "id", "-u"], capture_output=True, text=True
        ).stdout.strip()

    def healthcheck(self) -> tuple[bool, str]:
        """Run the image's HEALTHCHECK command (chroot: inside the image, pointed at this run's HTTP port)."""
        if self.proc is None:
            if self.engine != "podman":
                return True, "skipped: only podman runs a healthcheck on demand"
            done = subprocess.run([self.engine, "healthcheck", "run", self.container], capture_output=True, text=True)
            return done.returncode == 0, (done.stdout + done.stderr).strip() or "healthy"
        test = list(((self.config or {}).get("Healthcheck") or {}).get("Test") or [])
        if test[:1] != ["CMD"]:
            return False, f"no exec-form HEALTHCHECK in the image: {test}"
        argv = [a.replace("127.0.0.1:8000", f"127.0.0.1:{self.http_port}") for a in test[1:]]
        env = ["env", "-i", *((self.config or {}).get("Env") or [])]
        user = (self.config or {}).get("User") or "0:0"
        done = subprocess.run(
            ["chroot", f"--userspec={user}", self.root, *env, *argv], capture_output=True, text=True, timeout=30
        )
        return done.returncode == 0, f"{shlex.join(argv)[:60]}... exit {done.returncode}"

    def stop(self) -> int:
        """SIGTERM, then the exit status (killed after 60 s)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        subprocess.run([self.engine, "stop", "-t", "60", self.container], capture_output=True)
        code = self.exit_code()
        return -1 if code is None else code


def image_config(engine: str, image: str) -> dict:
    """The image's Config (Entrypoint, Cmd, Env, User, WorkingDir, Healthcheck)."""
    out = subprocess.run([engine, "image", "inspect", image], check=True, capture_output=True, text=True).stdout
    info = json.loads(out)[0]
    config = dict(info.get("Config") or info.get("config") or {})
    config.setdefault("Healthcheck", info.get("Healthcheck"))  # podman lists it beside Config
    return config


@contextlib.contextmanager
def run_container(engine: str, image: str, repo: Path, shm_size: str, log_path: Path) -> Iterator[Running | None]:
    """`<engine> run` with the repository mounted at /models; None when the engine cannot run containers here."""
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    name = f"trireme-smoke-{grpc_port}"
    cmd = [engine, "run", "-d", "--name", name, f"--shm-size={shm_size}", "-p", f"127.0.0.1:{grpc_port}:8001"]
    cmd += ["-p", f"127.0.0.1:{http_port}:8000", "-p", f"127.0.0.1:{metrics_port}:8002"]
    cmd += ["-v", f"{repo}:/models:ro", image]
    started = subprocess.run(cmd, capture_output=True, text=True)
    if started.returncode != 0:
        print(f"  `{engine} run` failed: {started.stderr.strip().splitlines()[-1:]}", flush=True)
        subprocess.run([engine, "rm", "-f", name], capture_output=True)
        yield None
        return
    with open(log_path, "wb") as log:
        follower = subprocess.Popen([engine, "logs", "-f", name], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Running(log_path, grpc_port, http_port, metrics_port, f"{engine} run", container=name, engine=engine)
    finally:
        subprocess.run([engine, "rm", "-f", "-t", "10", name], capture_output=True)
        follower.wait(30)


@contextlib.contextmanager
def run_chroot(engine: str, image: str, repo: Path, shm_size: str, log_path: Path) -> Iterator[Running]:
    """The image's entrypoint under chroot in a private mount namespace (for sandboxes without an OCI runtime)."""
    config = image_config(engine, image)
    root = subprocess.run([engine, "image", "mount", image], check=True, capture_output=True, text=True).stdout.strip()
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    # host networking here: the ports the container would publish become free host ports
    argv += [f"--grpc-port={grpc_port}", f"--http-port={http_port}", f"--metrics-port={metrics_port}"]
    env = ["env", "-i", *(config.get("Env") or [])]
    inner = f"cd {shlex.quote(config.get('WorkingDir') or '/')} && exec {shlex.join(argv)}"
    user = config.get("User") or "0:0"
    script = "\n".join(
        [
            "set -e",
            f"R={shlex.quote(root)}",
            'mount -t proc proc "$R/proc"',
            'mount --rbind /dev "$R/dev"',
            f'mount -t tmpfs -o size={shlex.quote(shm_size)},mode=1777 shm "$R/dev/shm"',
            f'mount --bind {shlex.quote(str(repo))} "$R/models"',
            'mount -o remount,bind,ro "$R/models"',
            f'exec chroot --userspec={shlex.quote(user)} "$R" {shlex.join(env)} sh -c {shlex.quote(inner)}',
        ]
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield Running(
            log_path,
            grpc_port,
            http_port,
            metrics_port,
            "podman image mount + chroot",
            proc=proc,
            root=root,
            config=config,
        )
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        subprocess.run([engine, "image", "unmount", image], capture_output=True)


def wait_ready(running: Running, timeout_s: float) -> float:
    """Seconds from process start until the server says ready over gRPC."""
    start = time.monotonic()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    while time.monotonic() - start < timeout_s:
        code = running.exit_code()
        if code is not None:
            raise RuntimeError(f"the server exited with {code}:\n{running.log()}")
        with contextlib.suppress(Exception):
            if client.is_server_ready():
                return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"not ready after {timeout_s} s:\n{running.log()}")


def check(label: str, ok: bool, detail: str = "") -> bool:
    """Print one check's outcome."""
    print(f"  [{'ok' if ok else 'FAIL'}] {label}{': ' + detail if detail else ''}", flush=True)
    return ok


def smoke(running: Running) -> bool:
    """gRPC, HTTP and metrics checks against the example repository."""
    ok = True
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    meta = g.get_server_metadata()
    ok &= check("gRPC server metadata", meta.name == "triton", f"{meta.name} {meta.version}")
    models = sorted(m.name for m in g.get_model_repository_index().models if m.state == "READY")
    ok &= check("models READY", "add_sub" in models, ", ".join(models))
    n = int(g.get_model_metadata("add_sub").inputs[0].shape[-1])
    a, b = np.arange(n, dtype=np.float32), np.full(n, 2.0, np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [n], "FP32"), grpcclient.InferInput("INPUT1", [n], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    out = g.infer("add_sub", inputs)
    ok &= check("gRPC infer add_sub", np.array_equal(out.as_numpy("OUTPUT0"), a + b), "OUTPUT0 = INPUT0 + INPUT1")
    if "fc_model_pt" in models:
        x = grpcclient.InferInput("input__0", [2, 3], "INT64")
        x.set_data_from_numpy(np.arange(6, dtype=np.int64).reshape(2, 3))
        shape = g.infer("fc_model_pt", [x]).as_numpy("output__0").shape
        ok &= check("gRPC infer fc_model_pt (torch in the image)", shape == (2, 3, 4), f"output__0 shape {shape}")
    h = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
    ok &= check("HTTP /v2/health/ready", h.is_server_ready())
    hin = [httpclient.InferInput("INPUT0", [n], "FP32"), httpclient.InferInput("INPUT1", [n], "FP32")]
    hin[0].set_data_from_numpy(a)
    hin[1].set_data_from_numpy(b)
    hout = h.infer("add_sub", hin)
    ok &= check("HTTP infer add_sub", np.array_equal(hout.as_numpy("OUTPUT1"), a - b), "OUTPUT1 = INPUT0 - INPUT1")
    with urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    done = re.search(r'nv_inference_request_success\{model="add_sub",version="1"\} (\d+)', text)
    ok &= check(
        "metrics :8002/metrics",
        "nv_inference_pending_request_count" in text and done is not None and int(done.group(1)) >= 2,
        f"add_sub successes {done.group(1) if done else None}, pending-request gauge present",
    )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="podman")
    p.add_argument("--image", default="localhost/trireme:cpu")
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--shm-size", default="64m")
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    repo = args.model_repository.resolve()
    log_path = Path(tempfile.mkdtemp(prefix="trireme-smoke-")) / "server.log"
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(run_container(args.engine, args.image, repo, args.shm_size, log_path))
        if running is None:
            print("  running the image by podman image mount + chroot instead", flush=True)
            running = stack.enter_context(run_chroot(args.engine, args.image, repo, args.shm_size, log_path))
        print(f"[smoke] {args.image} via {running.how}, /dev/shm {args.shm_size}, /models <- {repo}", flush=True)
        seconds = wait_ready(running, args.timeout)
        print(f"[smoke] start time (process start -> gRPC ready): {seconds:.1f} s", flush=True)
        uid = running.user()
        ok = check("server runs as non-root", uid not in ("", "0"), f"uid {uid}")
        for line in running.log().splitlines():
            if "arena" in line.lower():
                print(f"  log: {line}", flush=True)
        ok &= smoke(running)
        ok &= check("HEALTHCHECK", *running.healthcheck())
        code = running.stop()
        ok &= check("SIGTERM -> clean exit", code == 0, f"exit status {code}")
    if not ok:
        print(log_path.read_text(errors="replace"), file=sys.stderr)
    print(f"[smoke] {'PASSED' if ok else 'FAILED'} (server log {log_path})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
