"""Write Triton's `inception_graphdef` example model: a frozen TensorFlow GraphDef plus its config.pbtxt.

The architecture is InceptionV3 from tf.keras.applications with random weights (weights=None: nothing is
downloaded, so the answers are meaningless but the compute is the real model's). The graph gets the tensor names
of Triton's example: input `input` [299,299,3] FP32 (NHWC, any batch) and output `InceptionV3/Predictions/Softmax`
[1001] FP32 (1000 ImageNet classes plus background, as in the TF-slim original).

    python tools/make_inception_graphdef.py --repo /tmp/repo            # /tmp/repo/inception_graphdef/{config.pbtxt,1/}
    python tools/make_inception_graphdef.py --repo /tmp/repo --arch tiny  # same names and shapes, a few layers

`--arch tiny` is a small conv net with the same interface, for tests and quick rehearsals of the walkthrough.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

INPUT = "input"
OUTPUT = "InceptionV3/Predictions/Softmax"
CLASSES = 1001

CONFIG = """\
name: "{name}"
platform: "tensorflow_graphdef"
max_batch_size: {max_batch_size}
input [
  {{
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NHWC
    dims: [ 299, 299, 3 ]
  }}
]
output [
  {{
    name: "InceptionV3/Predictions/Softmax"
    data_type: TYPE_FP32
    dims: [ 1001 ]
  }}
]
{extra}"""


def build_keras(arch: str, seed: int) -> Any:
    """The Keras model: InceptionV3 (random weights, 1001 classes) or a tiny conv net with the same interface."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    if arch == "inception_v3":
        return tf.keras.applications.InceptionV3(
            weights=None, include_top=True, classes=CLASSES, input_shape=(299, 299, 3), classifier_activation=None
        )
    layers = tf.keras.layers
    inp = tf.keras.Input((299, 299, 3))
    x = layers.Conv2D(8, 3, strides=4, activation="relu")(inp)
    x = layers.Conv2D(16, 3, strides=2, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inp, layers.Dense(CLASSES)(x))


def frozen_graphdef(model: Any) -> Any:
    """The model as a frozen GraphDef (variables folded into constants) with Triton's input and output names."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    @tf.function(input_signature=[tf.TensorSpec([None, 299, 299, 3], tf.float32, name=INPUT)])
    def serve(images: Any) -> Any:
        # the softmax is an op of its own named as in the TF-slim graph Triton's example was exported from
        return tf.nn.softmax(model(images, training=False), name=OUTPUT)

    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    names = {node.name for node in graph_def.node}
    if INPUT not in names or OUTPUT not in names:
        raise RuntimeError(f"the frozen graph lacks '{INPUT}' or '{OUTPUT}'")
    return graph_def


def write_model(
    repo: Path,
    name: str = "inception_graphdef",
    arch: str = "inception_v3",
    max_batch_size: int = 128,
    extra_config: str = "",
    seed: int = 0,
) -> Path:
    """Write <repo>/<name>/1/model.graphdef and <repo>/<name>/config.pbtxt; returns the model directory."""
    model_dir = Path(repo) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    graph_def = frozen_graphdef(build_keras(arch, seed))
    (model_dir / "1" / "model.graphdef").write_bytes(graph_def.SerializeToString())
    (model_dir / "config.pbtxt").write_text(CONFIG.format(name=name, max_batch_size=max_batch_size, extra=extra_config))
    return model_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", required=True, help="model repository folder to write into")
    parser.add_argument("--name", default="inception_graphdef")
    parser.add_argument("--arch", choices=("inception_v3", "tiny"), default="inception_v3")
    parser.add_argument("--max-batch-size", type=int, default=128, help="as in Triton's example config")
    parser.add_argument(
        "--extra-config", default="", help="text appended to config.pbtxt (e.g. 'dynamic_batching { }')"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    model_dir = write_model(Path(args.repo), args.name, args.arch, args.max_batch_size, args.extra_config, args.seed)
    size = (model_dir / "1" / "model.graphdef").stat().st_size
    print(f"wrote {model_dir} ({size / 1e6:.1f} MB GraphDef)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
