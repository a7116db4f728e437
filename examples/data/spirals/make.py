#!/usr/bin/env python3
"""Writes the spirals data set examples/jobs/mlp-arrays.yaml trains on: three interleaved 2-D spirals, a
classic task no linear model solves, as train.safetensors (3000 samples) and test.safetensors (600).

    pip install numpy safetensors
    python3 examples/data/spirals/make.py

Deterministic: NumPy's legacy RandomState gives the same numbers in every version, so the files are the same
bytes on every machine. Tensors: `inputs` float32 [samples, 2], `labels` int64 [samples]."""
import os

import numpy as np
from safetensors.numpy import save_file

CLASSES = 3


def spirals(per_class, rng):
    xs, ys = [], []
    for k in range(CLASSES):
        t = rng.uniform(0.05, 1.0, per_class)
        theta = 2 * np.pi * k / CLASSES + 3.5 * np.pi * t + rng.normal(0.0, 0.15, per_class)
        r = 2.0 * t
        xs.append(np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1))
        ys.append(np.full(per_class, k, dtype=np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    order = rng.permutation(len(y))
    return x[order].astype(np.float32), y[order]


here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.RandomState(15)
for name, per_class in [("train", 1000), ("test", 200)]:
    x, y = spirals(per_class, rng)
    save_file({"inputs": np.ascontiguousarray(x), "labels": y}, os.path.join(here, f"{name}.safetensors"))
    print(name, x.shape, np.bincount(y))
