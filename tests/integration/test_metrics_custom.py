"""pb_utils custom metrics (MetricFamily / Metric) from real Python models, exported on the metrics endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, running_server, write_model
from tests.integration.metrics_scrape import scrape

# per request: a counter +1 (labels), a gauge set to the input's sum, a histogram observes the input's length
TRAFFIC_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        model = args["model_name"]
        self.requests = pb_utils.MetricFamily("app_requests", "Requests the model saw", pb_utils.MetricFamily.COUNTER)
        self.counted = self.requests.Metric(labels={"model": model, "kind": "all"})
        self.gauges = pb_utils.MetricFamily("app_last_sum", "Sum of the last input", pb_utils.GAUGE)
        self.last = self.gauges.Metric(labels={"model": model})
        self.lengths = pb_utils.MetricFamily("app_input_length", "Input lengths", pb_utils.MetricFamily.HISTOGRAM)
        self.length = self.lengths.Metric(labels={"model": model}, buckets=[1.0, 2.5, 5.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.counted.increment(1)
            self.last.set(float(x.sum()))
            self.length.observe(float(x.size))
            total = np.array([self.counted.value()], np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total)]))
        return responses
"""

# runs the API's checks (Triton's python_backend behaviours) inside execute and returns what failed, as JSON
API_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

MF = pb_utils.MetricFamily


class TritonPythonModel:
    def initialize(self, args):
        self.keep = []

    def check(self, failures, name, fn):
        try:
            fn()
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")

    def raises(self, failures, name, fn, text=""):
        try:
            fn()
        except pb_utils.TritonModelException as e:
            if text not in str(e):
                failures.append(f"{name}: wrong message {e}")
            return
        except Exception as e:
            failures.append(f"{name}: raised {type(e).__name__}: {e}")
            return
        failures.append(f"{name}: did not raise")

    def counter(self, failures):
        family = MF("api_counter", "api counter", MF.COUNTER)
        metric = family.Metric(labels={"example1": "counter_label1", "example2": "counter_label2"})
        self.keep += [family, metric]
        assert metric.value() == 0.0
        metric.increment(2023.0)
        assert metric.value() == 2023.0, metric.value()
        self.raises(failures, "counter decrement", lambda: metric.increment(-23.5))
        self.raises(failures, "counter set", lambda: metric.set(999.9))
        self.raises(failures, "counter observe", lambda: metric.observe(0.05))
        assert metric.value() == 2023.0

    def gauge(self, failures):
        family = MF("api_gauge", "api gauge", MF.GAUGE)
        metric = family.Metric(labels={"example1": "gauge_label1"})
        self.keep += [family, metric]
        metric.increment(2023.0)
        metric.increment(-23.5)
        assert metric.value() == 1999.5, metric.value()
        metric.set(999.9)
        assert metric.value() == 999.9
        self.raises(failures, "gauge observe", lambda: metric.observe(0.05))

    def histogram(self, failures):
        family = MF("api_histogram", "api histogram", MF.HISTOGRAM)
        self.raises(failures, "no buckets", lambda: family.Metric(labels={}))
        self.raises(failures, "None buckets", lambda: family.Metric(labels={}, buckets=None))
        self.raises(failures, "unsorted buckets", lambda: family.Metric(labels={}, buckets=[2.5, 0.1, 1.0]))
        self.raises(failures, "duplicate buckets", lambda: family.Metric(labels={}, buckets=[1, 1, 2]))
        self.keep.append(family.Metric(labels={"empty": "1"}, buckets=[]))
        metric = family.Metric(labels={"example1": "histogram_label1"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
        self.keep += [family, metric]
        self.raises(failures, "histogram value", lambda: metric.value())
        self.raises(failures, "histogram increment", lambda: metric.increment(1))
        self.raises(failures, "histogram set", lambda: metric.set(1))
        for datum in (0.05, 1.5, 6.0):
            metric.observe(datum)

    def duplicates(self, failures):
        first = MF("api_dup", "first description", MF.COUNTER)
        second = MF("api_dup", "second description", MF.COUNTER)
        self.raises(failures, "same name, other kind", lambda: MF("api_dup", "x", MF.GAUGE))
        m1 = first.Metric(labels={"k": "same"})
        m2 = second.Metric(labels={"k": "same"})
        other = second.Metric(labels={"k": "other"})
        self.keep += [second, m2, other]
        m1.increment(7.5)
        assert m2.value() == 7.5, m2.value()  # the same labels are the same metric
        assert other.value() == 0.0
        del m1, first  # the family stays: `second` still references it

    def lifetime(self, failures):
        family = MF("api_lifetime", "lifetime", MF.GAUGE)
        metric = family.Metric(labels={})
        del family  # deleted before its metric: the metric can no longer be used
        text = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
        self.raises(failures, "after family deleted: increment", lambda: metric.increment(1), text)
        self.raises(failures, "after family deleted: set", lambda: metric.set(1), text)
        self.raises(failures, "after family deleted: value", lambda: metric.value(), text)

    def names(self, failures):
        self.raises(failures, "bad name", lambda: MF("bad name", "x", MF.COUNTER))
        self.raises(failures, "reserved name", lambda: MF("nv_inference_count", "x", MF.COUNTER))
        self.raises(failures, "bad kind", lambda: MF("api_kind", "x", 7))

    def execute(self, requests):
        failures = []
        for step in (self.counter, self.gauge, self.histogram, self.duplicates, self.lifetime, self.names):
            self.check(failures, step.__name__, lambda: step(failures))
        out = np.array([json.dumps(failures).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("FAILURES", out)]) for _ in requests]
"""


# per request: update a counter, a gauge and a histogram, then scrape /metrics (URL in the input) from execute and
# answer the three values the scrape showed: a model sees its own updates at once, as in Triton
SELF_SCRAPE_MODEL = """
import json
import re
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils

MF = pb_utils.MetricFamily


class TritonPythonModel:
    def initialize(self, args):
        self.model = args["model_name"]
        labels = {"model": self.model}
        self.families = [MF("self_seen", "updates", MF.COUNTER), MF("self_last", "last", MF.GAUGE)]
        self.families.append(MF("self_hist", "hist", MF.HISTOGRAM))
        self.count = self.families[0].Metric(labels=labels)
        self.gauge = self.families[1].Metric(labels=labels)
        self.hist = self.families[2].Metric(labels=labels, buckets=[1.0])

    def read(self, text, name):
        found = re.search(name + r'{model="' + self.model + r'"} (\\S+)', text)
        return float(found.group(1)) if found else -1.0

    def execute(self, requests):
        responses = []
        for request in requests:
            url = pb_utils.get_input_tensor_by_name(request, "URL").as_numpy()[0].decode()
            self.count.increment(1)
            self.gauge.set(float(len(responses) + 41))
            self.hist.observe(0.5)
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            seen = [self.read(text, n) for n in ("self_seen", "self_last", "self_hist_count")]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array(seen, np.float64))]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    for name, mode in (("traffic", "process"), ("traffic_inproc", "in_process")):
        write_model(
            repo,
            name,
            f"""
            name: "{name}"
            backend: "python"
            input {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }}
            output {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }}
            instance_group {{ count: 2 kind: KIND_CPU }}
            parameters {{ key: "TRIREME_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}
            """,
            TRAFFIC_MODEL,
        )
        write_model(
            repo,
            f"self_scrape_{mode}",
            f"""
            name: "self_scrape_{mode}"
            backend: "python"
            input {{ name: "URL" data_type: TYPE_STRING dims: [ 1 ] }}
            output {{ name: "SEEN" data_type: TYPE_FP64 dims: [ 3 ] }}
            parameters {{ key: "TRIREME_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}
            """,
            SELF_SCRAPE_MODEL,
        )
    write_model(
        repo,
        "metrics_api",
        """
        name: "metrics_api"
        backend: "python"
        input { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }
        output { name: "FAILURES" data_type: TYPE_STRING dims: [ 1 ] }
        """,
        API_MODEL,
    )
    with running_server([repo], tmp_path_factory.mktemp("log") / "server.log") as srv:
        yield srv


@pytest.mark.parametrize("model", ["traffic", "traffic_inproc"])
def test_model_metrics_follow_the_traffic(server: ServerProcess, model: str) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    lengths = [1, 2, 3, 6, 2, 10]
    totals = []
    for n in lengths:
        x = np.arange(n, dtype=np.float32)
        t = grpcclient.InferInput("IN", [n], "FP32")
        t.set_data_from_numpy(x)
        totals.append(float(client.infer(model, [t]).as_numpy("OUT")[0]))
    client.close()
    # value() reads the server's value: both instances add to the same metric
    assert totals == [1, 2, 3, 4, 5, 6]
    m = scrape(server.metrics_url)
    assert m.families["app_requests"].documentation == "Requests the model saw"
    assert m.families["app_requests"].type == "counter"
    assert m.value("app_requests", model=model, kind="all") == len(lengths)
    assert m.value("app_last_sum", model=model) == float(sum(range(10)))
    labels = {"model": model}
    assert m.value("app_input_length_count", **labels) == len(lengths)
    assert m.value("app_input_length_sum", **labels) == sum(lengths)
    assert m.value("app_input_length_bucket", le="1", **labels) == 1
    assert m.value("app_input_length_bucket", le="2.5", **labels) == 3
    assert m.value("app_input_length_bucket", le="5", **labels) == 4
    assert m.value("app_input_length_bucket", le="+Inf", **labels) == 6


@pytest.mark.parametrize("mode", ["process", "in_process"])
def test_a_model_sees_its_own_updates_at_once(server: ServerProcess, mode: str) -> None:
    """The model updates its metrics and scrapes /metrics within the same request: the scrape holds them."""
    with grpcclient.InferenceServerClient(server.url) as client:
        url = grpcclient.InferInput("URL", [1], "BYTES")
        url.set_data_from_numpy(np.array([server.metrics_url.encode()], dtype=np.object_))
        for n in range(1, 6):
            seen = client.infer(f"self_scrape_{mode}", [url]).as_numpy("SEEN")
            assert seen is not None and seen.tolist() == [n, 41, n], (n, seen)


def test_api_behaves_as_triton_python_backend(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.url)
    t = grpcclient.InferInput("IN", [1], "FP32")
    t.set_data_from_numpy(np.zeros(1, np.float32))
    failures = json.loads(client.infer("metrics_api", [t]).as_numpy("FAILURES")[0])
    client.close()
    assert failures == []
    text = scrape(server.metrics_url).text
    # the exposition Triton's own python_backend tests look for
    for pattern in (
        "# HELP api_counter api counter",
        "# TYPE api_counter counter",
        'api_counter{example1="counter_label1",example2="counter_label2"} 2023',
        'api_gauge{example1="gauge_label1"} 999.9',
        'api_histogram_count{example1="histogram_label1"} 3',
        'api_histogram_sum{example1="histogram_label1"} 7.55',
        'api_histogram_bucket{example1="histogram_label1",le="0.1"} 1',
        'api_histogram_bucket{example1="histogram_label1",le="1"} 1',
        'api_histogram_bucket{example1="histogram_label1",le="2.5"} 2',
        'api_histogram_bucket{example1="histogram_label1",le="5"} 2',
        'api_histogram_bucket{example1="histogram_label1",le="10"} 3',
        'api_histogram_bucket{example1="histogram_label1",le="+Inf"} 3',
        'api_histogram_bucket{empty="1",le="+Inf"} 0',
        "# HELP api_dup first description",
        'api_dup{k="same"} 7.5',
        'api_dup{k="other"} 0',
    ):
        assert pattern + "\n" in text, pattern
    assert "second description" not in text
    assert "api_lifetime" not in text  # its family was deleted
