#!/usr/bin/env python3
"""xgboost's and lightgbm's own predict from Python on the reference rows, for comparison
with `cargo bench -p mesh-trees --bench predict`: single-row p50/p99 and rows/s at batch
1, 10, 100, 1000 (numpy float32 input, the library's default threads).

    python3 -m venv /tmp/treesvenv && /tmp/treesvenv/bin/pip install xgboost lightgbm
    /tmp/treesvenv/bin/python trees/benches/compare.py
"""
import csv
import os
import time

import lightgbm as lgb
import numpy as np
import xgboost as xgb

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/fraud-trees")


def rows():
    with open(os.path.join(DATA, "samples.csv")) as f:
        r = csv.reader(f)
        header = next(r)
        X = [[float(c) if c else np.nan for c in line[1:35]] for line in r]
    assert header[33:35] == ["mcc", "country"]
    return np.asarray(X, dtype=np.float32)


def measure(name, predict, X):
    n = len(X)
    for i in range(200):
        predict(X[i % n : i % n + 1])
    times = []
    for rep in range(3):
        for i in range(n):
            t = time.perf_counter()
            predict(X[i : i + 1])
            times.append(time.perf_counter() - t)
    times.sort()
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    line = [f"{name}: single row p50 {p50 * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us;"]
    for batch in (1, 10, 100, 1000):
        calls, done, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < 2.0:
            s = (calls * batch) % n
            if s + batch > n:
                s = 0
            predict(X[s : s + batch])
            calls += 1
            done += batch
        line.append(f"batch {batch}: {done / (time.perf_counter() - t0):,.0f} rows/s;")
    print(" ".join(line))


def check(name, p, expected):
    d = float(np.abs(np.asarray(p, dtype=np.float64) - expected).max())
    print(f"{name}: max |diff| against samples.csv {d:.2e}")


def main():
    X = rows()
    with open(os.path.join(DATA, "samples.csv")) as f:
        ref = list(csv.DictReader(f))
    bst = xgb.Booster(model_file=os.path.join(DATA, "fraud_xgb.json"))
    ft = ["float"] * 32 + ["c", "c"]
    names = bst.feature_names
    check("xgboost inplace_predict", bst.inplace_predict(X), np.array([float(r["xgb_proba"]) for r in ref]))
    # inplace_predict is xgboost's fastest path for numpy input.
    measure(f"xgboost {xgb.__version__} inplace_predict", lambda x: bst.inplace_predict(x), X)
    measure(
        f"xgboost {xgb.__version__} DMatrix+predict",
        lambda x: bst.predict(xgb.DMatrix(x, feature_names=names, feature_types=ft, enable_categorical=True)),
        X,
    )
    lg = lgb.Booster(model_file=os.path.join(DATA, "fraud_lgbm.txt"))
    check("lightgbm predict", lg.predict(X), np.array([float(r["lgbm_proba"]) for r in ref]))
    measure(f"lightgbm {lgb.__version__} predict", lambda x: lg.predict(x), X)
    onnx_runtime(X, bst, lg, ref)


def onnx_runtime(X, bst, lg, ref):
    try:
        import onnxmltools
        import onnxruntime as ort
        from onnxmltools.convert.common.data_types import FloatTensorType
    except ImportError as e:
        print(f"ONNX Runtime comparison skipped: {e}")
        return
    inputs = [("input", FloatTensorType([None, X.shape[1]]))]
    models = []
    try:
        # zipmap=False: probabilities as one [N, 2] tensor, as the mesh's kind onnx reads it.
        models.append(("lightgbm", onnxmltools.convert_lightgbm(lg, initial_types=inputs, target_opset=15, zipmap=False), "lgbm_proba"))
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"onnxmltools cannot convert the LightGBM model: {e}")
    try:
        b = bst.copy()
        b.feature_names, b.feature_types = None, None  # the converter wants f0, f1, ...
        models.append(("xgboost", onnxmltools.convert_xgboost(b, initial_types=inputs, target_opset=15), "xgb_proba"))
    except Exception as e:  # noqa: BLE001
        print(f"onnxmltools cannot convert the XGBoost model: {str(e).splitlines()[0][:200]}")
    for name, model, column in models:
        for threads in (1, 0):
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.log_severity_level = 3
            s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            out = [o.name for o in s.get_outputs()].index("probabilities")
            predict = lambda x, s=s, out=out: s.run(None, {"input": x})[out][:, 1]  # noqa: E731
            if threads == 1:
                check(f"{name} via ONNX Runtime", predict(X), np.array([float(r[column]) for r in ref]))
            label = "1 thread" if threads == 1 else "default threads"
            measure(f"{name} onnxmltools {onnxmltools.__version__} + onnxruntime {ort.__version__} ({label})", predict, X)


if __name__ == "__main__":
    main()
