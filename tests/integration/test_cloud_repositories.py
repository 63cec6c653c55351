"""Cloud model repositories (docs/cloud-repositories.md) through a real Trireme server and tritonclient, against
real storage servers started here: moto's S3 server, a GCS emulator and Azurite (each test skips, naming the
missing piece, where its server or client cannot be installed)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.certs import make_certs
from tests.conftest import write_model
from tests.integration.cloud_storage import (
    AZURITE_ACCOUNT,
    CountingProxy,
    azurite_server,
    gcs_server,
    s3_server,
    silent_endpoint,
)
from tests.integration.models import elementwise_py, python_config

pytestmark = [pytest.mark.single_pass, pytest.mark.timeout(240)]


def _model(folder: Path, name: str, add: int, version: int = 1, max_batch_size: int = 0) -> None:
    """A Python model answering OUTPUT0 = INPUT0 + add, in folder/name/version."""
    config = python_config(name, max_batch_size=max_batch_size)
    write_model(folder, name, config, elementwise_py(f"x + {add}"), version)


def _infer(client: grpcclient.InferenceServerClient, name: str, version: str = "") -> float:
    x = grpcclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.zeros(4, dtype=np.float32))
    return float(client.infer(name, [x], model_version=version).as_numpy("OUTPUT0")[0])


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except InferenceServerException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _exits(server, timeout_s: float = 90.0) -> str:  # type: ignore[no-untyped-def]
    """Wait for a server that must not start; its log."""
    rc = server.proc.wait(timeout_s)
    assert rc != 0
    assert "Started GRPCInferenceService" not in server.log()
    return str(server.log())


def _s3_env(monkeypatch: pytest.MonkeyPatch, s3) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)


# ---- S3 ------------------------------------------------------------------------------------------------------------
def test_s3_none_mode_serves_and_cleans_up(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """s3://host:port/bucket/path: the models load; the local copy lives in TRITON_AWS_MOUNT_DIRECTORY while the
    server runs and is gone after it stops."""
    _model(tmp_path / "src", "plus_one", 1)
    _model(tmp_path / "src", "plus_two", 2)
    mount = tmp_path / "mount"
    mount.mkdir()
    with s3_server() as s3:
        s3.client().create_bucket(Bucket="models")
        s3.upload("models", "deploy/repo", tmp_path / "src")
        _s3_env(monkeypatch, s3)
        monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(mount))
        server = start_server([f"s3://127.0.0.1:{s3.port}/models/deploy/repo"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0 and _infer(client, "plus_two") == 2.0
        copies = list(mount.iterdir())
        assert len(copies) == 1 and (copies[0] / "plus_one" / "1" / "model.py").is_file()
        client.close()
        server.stop()
    assert list(mount.iterdir()) == []


def test_s3_default_endpoint_form_and_temporary_copy(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """s3://bucket/path with the endpoint from AWS_ENDPOINT_URL (boto3's variable); without a mount directory the
    copy goes to a temporary folder (TMPDIR), removed at exit."""
    _model(tmp_path / "src", "plus_one", 1)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with s3_server() as s3:
        s3.client().create_bucket(Bucket="models")
        s3.upload("models", "", tmp_path / "src")
        _s3_env(monkeypatch, s3)
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        monkeypatch.setenv("TMPDIR", str(tmp))
        monkeypatch.delenv("TRITON_AWS_MOUNT_DIRECTORY", raising=False)
        server = start_server(["s3://models"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0
        assert [p.name.startswith("trireme-s3-") for p in tmp.iterdir()] == [True]
        client.close()
        server.stop()
    assert list(tmp.iterdir()) == []


def test_s3_https_endpoint(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """s3://https://host:port/bucket/path: TLS to the S3 server (its CA from AWS_CA_BUNDLE, boto3's variable)."""
    _model(tmp_path / "src", "plus_one", 1)
    certs = make_certs(tmp_path / "certs")
    with s3_server(tls=certs) as s3:
        s3.client().create_bucket(Bucket="models")
        s3.upload("models", "repo", tmp_path / "src")
        _s3_env(monkeypatch, s3)
        monkeypatch.setenv("AWS_CA_BUNDLE", str(certs.ca))
        server = start_server([f"s3://https://127.0.0.1:{s3.port}/models/repo"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0
        client.close()
        monkeypatch.delenv("AWS_CA_BUNDLE")  # the server's certificate is not trusted without it
        log = _exits(start_server([f"s3://https://127.0.0.1:{s3.port}/models/repo"], wait=False))
        assert "failed to read model repository" in log and "SSL" in log


def test_s3_explicit_load_after_upload(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Explicit mode: a model uploaded after start loads on request; a new version uploaded later is fetched by
    the next load; when the storage stops answering, a load fails naming the repository and the model serves on."""
    _model(tmp_path / "src", "plus_one", 1)
    with s3_server() as s3:
        s3.client().create_bucket(Bucket="models")
        s3.client().put_object(Bucket="models", Key="repo/README", Body=b"models go here")
        _s3_env(monkeypatch, s3)
        url = f"s3://127.0.0.1:{s3.port}/models/repo"
        server = start_server([url], ["--model-control-mode=explicit"])
        client = grpcclient.InferenceServerClient(server.url)
        assert [m.name for m in client.get_model_repository_index().models] == []
        s3.upload("models", "repo", tmp_path / "src")
        client.load_model("plus_one")
        assert _infer(client, "plus_one") == 1.0

        _model(tmp_path / "v2", "plus_one", 20, version=2)
        s3.upload("models", "repo", tmp_path / "v2")
        assert not client.is_model_ready("plus_one", "2")  # nothing is fetched until asked
        client.load_model("plus_one")
        assert client.is_model_ready("plus_one", "2") and _infer(client, "plus_one") == 20.0
        downloads_after_v2 = server.log().count("file(s) downloaded")

        client.load_model("plus_one")  # unchanged: a listing, no download
        assert server.log().count("file(s) downloaded") == downloads_after_v2
    # the S3 server is gone
    with pytest.raises(InferenceServerException) as info:
        client.load_model("plus_one")
    assert "failed to poll from model repository" in info.value.message() and url in info.value.message()
    assert _infer(client, "plus_one") == 20.0  # still serving
    with pytest.raises(InferenceServerException) as info:
        client.load_model("not_known_yet")  # a new name: the whole repository is polled, and fails the same way
    assert "failed to load 'not_known_yet', failed to poll from model repository" in info.value.message()
    assert url in info.value.message()
    client.close()


def test_s3_poll_picks_up_changes_and_unchanged_costs_no_downloads(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Poll mode through a counting proxy: an unchanged repository costs listings only; a new version and a changed
    config uploaded while serving are picked up, and a deleted model is unloaded."""
    _model(tmp_path / "src", "plus_one", 1)
    _model(tmp_path / "src", "other", 5)
    with s3_server() as s3:
        s3.client().create_bucket(Bucket="models")
        s3.upload("models", "repo", tmp_path / "src")
        _s3_env(monkeypatch, s3)
        proxy = CountingProxy(s3.port)
        try:
            url = f"s3://127.0.0.1:{proxy.port}/models/repo"
            server = start_server([url], ["--model-control-mode=poll", "--repository-poll-secs=1"])
            client = grpcclient.InferenceServerClient(server.url)
            assert _infer(client, "plus_one") == 1.0
            start = dict(proxy.counts)
            assert start.get("get", 0) == 4  # config.pbtxt + model.py of each model, once
            _wait(lambda: proxy.counts["list"] >= start["list"] + 3, "three more polls")
            assert proxy.counts["get"] == start["get"]  # unchanged: no download

            _model(tmp_path / "v2", "plus_one", 20, version=2)
            s3.upload("models", "repo", tmp_path / "v2")
            _wait(lambda: client.is_model_ready("plus_one", "2"), "version 2 to load")
            assert _infer(client, "plus_one") == 20.0
            assert proxy.counts["get"] == start["get"] + 1  # only the new model.py

            config = python_config("plus_one", extra='parameters { key: "tag" value: { string_value: "b" } }')
            s3.client().put_object(Bucket="models", Key="repo/plus_one/config.pbtxt", Body=config.encode())
            tag = lambda: client.get_model_config("plus_one").config.parameters["tag"].string_value  # noqa: E731
            _wait(lambda: tag() == "b", "the new config")
            assert _infer(client, "plus_one") == 20.0

            s3.client().delete_objects(
                Bucket="models",
                Delete={"Objects": [{"Key": f"repo/other/{k}"} for k in ("config.pbtxt", "1/model.py")]},
            )
            index = lambda: {m.name for m in client.get_model_repository_index().models}  # noqa: E731
            _wait(lambda: index() == {"plus_one"}, "the deleted model to leave the repository")
            with pytest.raises(InferenceServerException, match="unknown model"):
                _infer(client, "other")
            assert client.is_model_ready("plus_one")
            client.close()
        finally:
            proxy.close()


def test_mixed_local_and_s3(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _model(tmp_path / "local", "local_model", 3)
    _model(tmp_path / "src", "remote_model", 4)
    with s3_server() as s3:
        s3.client().create_bucket(Bucket="models")
        s3.upload("models", "r", tmp_path / "src")
        _s3_env(monkeypatch, s3)
        server = start_server([tmp_path / "local", f"s3://127.0.0.1:{s3.port}/models/r"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "local_model") == 3.0 and _infer(client, "remote_model") == 4.0
        names = {m.name for m in client.get_model_repository_index().models}
        assert names == {"local_model", "remote_model"}
        client.close()


def test_s3_credentials_bad_and_from_credential_file(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With IAM enforced: wrong keys in the environment stop the server with Triton's message; the same server
    starts when TRITON_CLOUD_CREDENTIAL_PATH's longest matching entry holds the right keys."""
    _model(tmp_path / "src", "plus_one", 1)
    with s3_server(auth=True) as s3:
        s3.client().create_bucket(Bucket="secure")
        s3.upload("secure", "repo", tmp_path / "src")
        url = f"s3://127.0.0.1:{s3.port}/secure/repo"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
        log = _exits(start_server([url], wait=False))
        assert f"failed to read model repository '{url}'" in log
        assert "Could not get MetaData for bucket with name secure" in log

        creds = tmp_path / "cloud_credential.json"
        wrong = {"key_id": "AKIAWRONGWRONGWRONG1", "secret_key": "wrong", "region": "us-east-1"}
        right = {"key_id": s3.key_id, "secret_key": s3.secret, "region": "us-east-1", "session_token": ""}
        creds.write_text(json.dumps({"s3": {"": wrong, f"s3://127.0.0.1:{s3.port}/secure": right}}))
        monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(creds))
        server = start_server([url])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0
        client.close()


def test_s3_errors_stop_the_server(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Unknown bucket, unreachable endpoint, an endpoint that never answers (bounded by TRIREME_CLOUD_TIMEOUT_S)
    and a malformed URL: the server does not start, and says why, naming the repository."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("TRIREME_CLOUD_TIMEOUT_S", "2")
    with s3_server() as s3:
        url = f"s3://127.0.0.1:{s3.port}/no-such-bucket/repo"
        log = _exits(start_server([url], wait=False))
        assert f"failed to read model repository '{url}'" in log and "404" in log
        closed_port = s3.port
    url = f"s3://127.0.0.1:{closed_port}/models/repo"  # nothing listens there now
    log = _exits(start_server([url], wait=False))
    assert f"failed to read model repository '{url}'" in log
    with silent_endpoint() as port:
        url = f"s3://127.0.0.1:{port}/models/repo"
        began = time.monotonic()
        log = _exits(start_server([url], wait=False), timeout_s=120)
        assert f"failed to read model repository '{url}'" in log and "timeout" in log.lower()
        assert time.monotonic() - began < 110
    log = _exits(start_server(["s3://Bad_Bucket/repo"], wait=False))
    assert "Invalid bucket name: 'Bad_Bucket'" in log


# ---- GCS -----------------------------------------------------------------------------------------------------------
def test_gcs_serves_and_polls(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """gs://: a new version uploaded while serving loads; when the storage goes away, polls fail (logged, bounded
    by TRIREME_CLOUD_TIMEOUT_S) and the model serves on."""
    _model(tmp_path / "src", "plus_one", 1)
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    monkeypatch.setenv("TRIREME_CLOUD_TIMEOUT_S", "3")
    with gcs_server(monkeypatch) as gcs:
        gcs.client().create_bucket("gmodels")
        gcs.upload("gmodels", "team/repo", tmp_path / "src")
        server = start_server(["gs://gmodels/team/repo"], ["--model-control-mode=poll", "--repository-poll-secs=1"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0
        _model(tmp_path / "v2", "plus_one", 30, version=2)
        gcs.upload("gmodels", "team/repo", tmp_path / "v2")
        _wait(lambda: client.is_model_ready("plus_one", "2"), "version 2 to load from GCS")
        assert _infer(client, "plus_one") == 30.0
        assert server.log().count("file(s) downloaded") == 2  # the start, then the new version only
        client.close()
        log = _exits(start_server(["gs://no-such-bucket/repo"], wait=False))
        assert "failed to read model repository 'gs://no-such-bucket/repo'" in log
        assert "Could not get MetaData for bucket with name no-such-bucket" in log
    _wait(lambda: "repository poll failed" in server.log(), "a poll to fail without the storage")
    assert "gs://gmodels/team/repo" in server.log().split("repository poll failed", 1)[1].splitlines()[0]
    client = grpcclient.InferenceServerClient(server.url)
    assert _infer(client, "plus_one") == 30.0
    client.close()


# ---- Azure ---------------------------------------------------------------------------------------------------------
def test_azure_serves_and_refuses_bad_key(tmp_path: Path, start_server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _model(tmp_path / "src", "plus_one", 1)
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_AUTH_TYPE"):
        monkeypatch.delenv(name, raising=False)
    with azurite_server(tmp_path / "azurite") as az:
        az.upload("amodels", "repo", tmp_path / "src")
        url = f"as://{AZURITE_ACCOUNT}/amodels/repo"
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string())
        server = start_server([url], ["--model-control-mode=explicit", "--load-model=*"])
        client = grpcclient.InferenceServerClient(server.url)
        assert _infer(client, "plus_one") == 1.0
        _model(tmp_path / "v2", "plus_one", 40, version=2)
        az.upload("amodels", "repo", tmp_path / "v2")
        client.load_model("plus_one")
        assert _infer(client, "plus_one") == 40.0
        client.close()

        bad = az.connection_string(key="d3Jvbmcga2V5IGZvciBhenVyaXRl")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", bad)
        log = _exits(start_server([url], wait=False))
        assert f"failed to read model repository '{url}'" in log
        assert "Failed to check if directory at" in log
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az.connection_string())
        log = _exits(start_server([f"as://{AZURITE_ACCOUNT}/no-such-container/repo"], wait=False))
        assert "no-such-container" in log and "failed to read model repository" in log
