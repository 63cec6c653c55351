"""Small TensorFlow models for the tensorflow backend tests, made by TensorFlow itself in a subprocess.

`python -m tests.integration.tf_models OUT` writes into OUT:
- graphdef/model.graphdef: a frozen GraphDef, input `x` FP32 [-1,4]; outputs `y` = x @ W FP32 [-1,3] and
  `am` = argmax(y) INT64 [-1];
- savedmodel/: a SavedModel with signature `serving_default` (a, b FP32 [-1,4] -> out = (a+b) @ W FP32 [-1,3],
  text = as_string(sum(a)) BYTES [-1,1]) and signature `double` (x FP32 [-1,4] -> twice = 2x);
- tiny/: tools/make_inception_graphdef.py's tiny conv net with the inception names (299x299x3 -> 1001);
- reference.npz: inputs and what TensorFlow answers for them (the tests compare the server's answers with these).
Running it in a subprocess keeps TensorFlow out of the pytest process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _tools() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_inception_graphdef", ROOT / "tools" / "make_inception_graphdef.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out: Path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 3)).astype(np.float32)

    class Graph(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x: Any) -> Any:
            y = tf.identity(tf.matmul(x, self.w), name="y")
            return y, tf.identity(tf.argmax(y, axis=1), name="am")

    graph = Graph()
    frozen = convert_variables_to_constants_v2(graph.__call__.get_concrete_function())
    (out / "graphdef").mkdir(parents=True, exist_ok=True)
    (out / "graphdef" / "model.graphdef").write_bytes(frozen.graph.as_graph_def().SerializeToString())

    class Saved(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(weights)

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 4], tf.float32, name="a"),
                tf.TensorSpec([None, 4], tf.float32, name="b"),
            ]
        )
        def serve(self, a: Any, b: Any) -> Any:
            text = tf.strings.as_string(tf.reduce_sum(a, axis=1, keepdims=True), precision=3)
            return {"out": tf.matmul(a + b, self.w), "text": text}

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def double(self, x: Any) -> Any:
            return {"twice": 2.0 * x}

    saved = Saved()
    tf.saved_model.save(
        saved, str(out / "savedmodel"), signatures={"serving_default": saved.serve, "double": saved.double}
    )

    tools = _tools()
    tiny = tools.build_keras("tiny", seed=1)
    (out / "tiny").mkdir(parents=True, exist_ok=True)
    (out / "tiny" / "model.graphdef").write_bytes(tools.frozen_graphdef(tiny).SerializeToString())

    x = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal((8, 4)).astype(np.float32)
    images = rng.random((2, 299, 299, 3), dtype=np.float32)
    y, am = graph(tf.constant(x))
    served = saved.serve(tf.constant(x), tf.constant(b))
    np.savez(
        out / "reference.npz",
        x=x,
        b=b,
        y=y.numpy(),
        am=am.numpy(),
        out=served["out"].numpy(),
        text=served["text"].numpy().astype(object),
        twice=saved.double(tf.constant(x))["twice"].numpy(),
        images=images,
        probs=tf.nn.softmax(tiny(images, training=False)).numpy(),
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
