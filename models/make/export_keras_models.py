#!/usr/bin/env python
"""Export small Keras models with LayerNormalization through tf2onnx, as Keras users convert them.

tf2onnx lowers Keras' LayerNormalization as tf.nn.moments then tf.nn.batch_normalization with the
affine folded in: `x * (gamma * r) + (beta - mean * gamma * r)`, r = 1 / sqrt(var + eps), the mean
as a ReduceMean, or a GlobalAveragePool where it averages a rank-3 tensor's last axis; with Keras'
default epsilon (1e-3) and the last axis it writes its fused BatchNormalization path instead.
Each model here is Dense -> LayerNormalization -> Dense, random weights (gamma and beta away from
1 and 0), opset 15:

    keras_ln_last_axis_3d   epsilon 1e-6 over the last axis of [batch, 7, 16] (GlobalAveragePool)
    keras_ln_last_axis_4d   epsilon 1e-6 over the last axis of [batch, 5, 7, 16] (ReduceMean)
    keras_ln_axis1_3d       axis 1 of [batch, 7, 16] (not the last: kept, not-last-axis)
    keras_ln_fused_3d       Keras' default epsilon (the fused BatchNormalization path)

    pip install tensorflow==2.15.1 tf2onnx==1.16.1 'onnx<1.17' numpy
    python models/make/export_keras_models.py [--out-dir models]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MODELS = {  # name -> (input shape without batch, LayerNormalization keywords)
    "keras_ln_last_axis_3d": ((7, 16), {"epsilon": 1e-6}),
    "keras_ln_last_axis_4d": ((5, 7, 16), {"epsilon": 1e-6}),
    "keras_ln_axis1_3d": ((7, 16), {"epsilon": 1e-6, "axis": 1}),
    "keras_ln_fused_3d": ((7, 16), {}),
}


def main(argv=None) -> None:
    import numpy as np
    import tensorflow as tf
    import tf2onnx

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    for name, (shape, keywords) in MODELS.items():
        x = tf.keras.Input(shape, name="x")
        ln = tf.keras.layers.LayerNormalization(**keywords)
        y = tf.keras.layers.Dense(8, name="head")(ln(tf.keras.layers.Dense(16, name="proj")(x)))
        model = tf.keras.Model(x, y)
        ln.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) for w in ln.get_weights()])
        spec = (tf.TensorSpec((None, *shape), tf.float32, name="x"),)
        out = args.out_dir / f"{name}.onnx"
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=15, output_path=str(out))
        print(f"{name}: {', '.join(n.op_type for n in proto.graph.node)}")


if __name__ == "__main__":
    main()
