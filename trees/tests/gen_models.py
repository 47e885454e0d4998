#!/usr/bin/env python3
"""Generates the small models under tests/data/fraud-trees/generated/ that the tests in
trees/tests/generated.rs check against: objectives and rules the fraud reference models
do not cover (logitraw, squared error, multiclass, LightGBM regression, missing type
zero and none), and rows at the edges of the rules (values equal to thresholds, zeros,
|x| <= 1e-35, NaN, negative, fractional and unseen category codes).

Run with xgboost 3.2.0 and lightgbm 4.7.0 (the versions the reference models came from):
    python3 -m venv /tmp/treesvenv && /tmp/treesvenv/bin/pip install xgboost lightgbm
    /tmp/treesvenv/bin/python trees/tests/gen_models.py
Each model X is written as X.json / X.txt plus X.csv: the input rows (empty = NaN) and
the library's prediction per output column (p0, p1, ...), 17 significant digits.
"""
import json
import os
import sys

import lightgbm as lgb
import numpy as np
import xgboost as xgb

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/fraud-trees/generated")
F = 6  # f0..f3 numeric, f4 numeric with zeros, f5 categorical (codes 0..9)
rng = np.random.default_rng(11)


def train_data(n=4000):
    X = rng.standard_normal((n, F)).astype(np.float32)
    X[:, 4] = np.where(rng.random(n) < 0.3, 0.0, X[:, 4])  # many exact zeros
    X[:, 5] = rng.integers(0, 10, n).astype(np.float32)
    X[rng.random(n) < 0.1, 1] = np.nan  # missing in f1
    X[rng.random(n) < 0.1, 4] = np.nan  # missing in f4
    score = X[:, 0] + np.nan_to_num(X[:, 1]) * X[:, 2] + np.isin(X[:, 5], [2, 7]) * 1.5 - np.nan_to_num(X[:, 4])
    return X, score


def edge_rows(thresholds):
    """Random rows plus rows whose values sit on the rules' edges."""
    X = rng.standard_normal((200, F)).astype(np.float32)
    X[:, 5] = rng.integers(0, 10, 200).astype(np.float32)
    X[rng.random(200) < 0.15, 1] = np.nan
    X[rng.random(200) < 0.15, 4] = np.nan
    rows = [X]
    special = [0.0, -0.0, 1e-36, -1e-36, 1e-35, -1e-35, 2e-35, -2e-35, np.nan]
    for f in range(5):
        for v in special + [np.float32(t) for t in thresholds.get(f, [])]:
            r = rng.standard_normal((3, F)).astype(np.float32)
            r[:, 5] = [1, 2, 7]
            r[:, f] = v
            rows.append(r)
            # the neighbours of a threshold
            if v in thresholds.get(f, []):
                for d in (np.nextafter(np.float32(v), np.float32(np.inf)), np.nextafter(np.float32(v), np.float32(-np.inf))):
                    r2 = r.copy()
                    r2[:, f] = d
                    rows.append(r2)
    for code in [np.nan, -1.0, -0.5, -3.0, 0.0, 2.0, 2.5, 7.0, 7.9, 9.0, 10.0, 15.0, 40.0, 1000.0, 3e9]:
        r = rng.standard_normal((2, F)).astype(np.float32)
        r[:, 5] = code
        rows.append(r)
    return np.vstack(rows).astype(np.float32)


def write_csv(name, X, P):
    P = np.asarray(P, dtype=np.float64).reshape(len(X), -1)
    with open(os.path.join(OUT, name + ".csv"), "w") as f:
        f.write(",".join([f"f{i}" for i in range(F)] + [f"p{j}" for j in range(P.shape[1])]) + "\n")
        for x, p in zip(X, P):
            cells = ["" if np.isnan(v) else repr(float(v)) for v in x] + ["%.17g" % v for v in p]
            f.write(",".join(cells) + "\n")


def xgb_thresholds(booster):
    out = {}
    for t in json.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]:
        for l, f, c, st in zip(t["left_children"], t["split_indices"], t["split_conditions"], t["split_type"]):
            if l != -1 and st == 0:
                out.setdefault(f, []).append(c)
    return {f: sorted(set(v))[:6] for f, v in out.items()}


def lgb_thresholds(booster):
    out = {}
    for t in booster.dump_model()["tree_info"]:
        stack = [t["tree_structure"]]
        while stack:
            n = stack.pop()
            if "split_feature" in n:
                if n["decision_type"] == "<=":
                    out.setdefault(n["split_feature"], []).append(float(n["threshold"]))
                stack += [n["left_child"], n["right_child"]]
    return {f: sorted(set(v))[:6] for f, v in out.items()}


def xgb_model(name, objective, label, **kw):
    X, _ = train_data()
    ft = ["q"] * 5 + ["c"]
    d = xgb.DMatrix(X, label=label(X), feature_types=ft, enable_categorical=True)
    params = dict(objective=objective, max_depth=4, eta=0.3, tree_method="hist", max_cat_to_onehot=1, **kw)
    b = xgb.train(params, d, num_boost_round=12)
    b.save_model(os.path.join(OUT, name + ".json"))
    E = edge_rows(xgb_thresholds(b))
    E[:, 5] = np.where(E[:, 5] < 0, np.nan, E[:, 5])  # XGBoost refuses negative codes in a DMatrix
    E[:, 5] = np.where(E[:, 5] > 1e6, 1000.0, E[:, 5])
    P = b.predict(xgb.DMatrix(E, feature_types=ft, enable_categorical=True))
    write_csv(name, E, P)


def lgb_model(name, objective, label, **kw):
    X, _ = train_data()
    params = dict(objective=objective, num_leaves=15, learning_rate=0.2, min_data_in_leaf=5, verbose=-1, max_cat_to_onehot=4, **kw)
    d = lgb.Dataset(X, label=label(X), categorical_feature=[5], params=params)
    b = lgb.train(params, d, num_boost_round=12)
    b.save_model(os.path.join(OUT, name + ".txt"))
    E = edge_rows(lgb_thresholds(b))
    P = b.predict(E)
    write_csv(name, E, P)


def main():
    os.makedirs(OUT, exist_ok=True)
    assert xgb.__version__ == "3.2.0" and lgb.__version__ == "4.7.0", (xgb.__version__, lgb.__version__)
    binary = lambda X: (X[:, 0] + np.nan_to_num(X[:, 2]) + np.isin(X[:, 5], [2, 7]) > 0.8).astype(np.float32)
    reg = lambda X: (X[:, 0] + np.nan_to_num(X[:, 1]) * X[:, 2] + np.isin(X[:, 5], [2, 7]) * 1.5 - np.nan_to_num(X[:, 4])).astype(np.float32)
    multi = lambda X: (np.digitize(reg(X), [-1.0, 0.5]) ).astype(np.float32)
    xgb_model("xgb_logitraw", "binary:logitraw", binary)
    xgb_model("xgb_logistic_base", "binary:logistic", binary, base_score=0.3)
    xgb_model("xgb_reg_logistic", "reg:logistic", binary)
    xgb_model("xgb_squarederror", "reg:squarederror", reg)
    xgb_model("xgb_softprob", "multi:softprob", multi, num_class=3)
    lgb_model("lgb_regression", "regression", reg)
    lgb_model("lgb_binary_sigmoid2", "binary", binary, sigmoid=2.0)
    lgb_model("lgb_zero_as_missing", "regression", reg, zero_as_missing=True)
    lgb_model("lgb_no_missing", "regression", reg, use_missing=False)
    lgb_model("lgb_multiclass", "multiclass", multi, num_class=3)
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    sys.exit(main())
