//! Each split rule on hand-made one-split models, and the refusals.

use mesh_trees::{Forest, TreeError};

fn one(forest: &Forest, row: &[f32]) -> f32 {
    let mut out = vec![0.0f32; forest.num_outputs()];
    forest.predict(row, 1, &mut out).expect("predict");
    out[0]
}

// ---------------------------------------------------------------- XGBoost helpers

/// One XGBoost tree as JSON. Leaves have left child -1 and their value in `conds`.
#[allow(clippy::too_many_arguments)]
fn xgb_tree(
    lefts: &[i64],
    rights: &[i64],
    feats: &[i64],
    conds: &[f64],
    dleft: &[i64],
    types: &[i64],
    cats: &[i64],
    cat_nodes: &[i64],
) -> String {
    let n = lefts.len();
    let j = |v: &[i64]| format!("{v:?}");
    let zeros = format!("{:?}", vec![0.0; n]);
    let parents = format!("{:?}", vec![0; n]);
    let sizes = if cat_nodes.is_empty() {
        vec![]
    } else {
        vec![cats.len() as i64]
    };
    let segs = if cat_nodes.is_empty() {
        vec![]
    } else {
        vec![0i64]
    };
    format!(
        r#"{{"base_weights":{zeros},"categories":{cats},"categories_nodes":{cn},"categories_segments":{segs},"categories_sizes":{sizes},
        "default_left":{dl},"id":0,"left_children":{l},"loss_changes":{zeros},"parents":{parents},"right_children":{r},
        "split_conditions":{c:?},"split_indices":{f},"split_type":{t},"sum_hessian":{zeros},
        "tree_param":{{"num_deleted":"0","num_feature":"2","num_nodes":"{n}","size_leaf_vector":"1"}}}}"#,
        cats = j(cats),
        cn = j(cat_nodes),
        segs = j(&segs),
        sizes = j(&sizes),
        dl = j(dleft),
        l = j(lefts),
        r = j(rights),
        c = conds,
        f = j(feats),
        t = j(types),
    )
}

fn xgb_model(
    objective: &str,
    base_score: &str,
    booster: &str,
    version: &str,
    trees: &[String],
) -> String {
    let n = trees.len();
    format!(
        r#"{{"learner":{{"attributes":{{}},"feature_names":["x","c"],"feature_types":["float","c"],
        "gradient_booster":{{"model":{{"gbtree_model_param":{{"num_parallel_tree":"1","num_trees":"{n}"}},
        "iteration_indptr":[],"tree_info":{info:?},"trees":[{trees}]}},"name":"{booster}"}},
        "learner_model_param":{{"base_score":"{base_score}","boost_from_average":"1","num_class":"0","num_feature":"2","num_target":"1"}},
        "objective":{{"name":"{objective}","reg_loss_param":{{"scale_pos_weight":"1"}}}}}},"version":{version}}}"#,
        info = vec![0; n],
        trees = trees.join(","),
    )
}

/// Root splits on x < 0.5; left leaf 1.0, right leaf 2.0.
fn xgb_numeric(default_left: bool) -> Forest {
    let t = xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[0, 0, 0],
        &[0.5, 1.0, 2.0],
        &[default_left as i64, 0, 0],
        &[0, 0, 0],
        &[],
        &[],
    );
    let json = xgb_model("reg:squarederror", "[0E0]", "gbtree", "[3,2,0]", &[t]);
    Forest::from_xgboost_json(json.as_bytes()).expect("load")
}

/// Root splits on feature 1 with set {0, 5, 40}; left leaf 1.0, right leaf 2.0.
fn xgb_categorical(default_left: bool) -> Forest {
    let t = xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[1, 0, 0],
        &[0.0, 1.0, 2.0],
        &[default_left as i64, 0, 0],
        &[1, 0, 0],
        &[0, 5, 40],
        &[0],
    );
    let json = xgb_model("reg:squarederror", "[0E0]", "gbtree", "[3,2,0]", &[t]);
    Forest::from_xgboost_json(json.as_bytes()).expect("load")
}

#[test]
fn xgboost_numeric_is_strictly_less_than_in_f32() {
    let f = xgb_numeric(false);
    assert_eq!(
        one(&f, &[0.5, 0.0]),
        2.0,
        "equal to the threshold goes right"
    );
    assert_eq!(
        one(&f, &[0.499_999_97, 0.0]),
        1.0,
        "the f32 below goes left"
    );
    assert_eq!(one(&f, &[f32::NEG_INFINITY, 0.0]), 1.0);
    assert_eq!(one(&f, &[f32::INFINITY, 0.0]), 2.0);
}

#[test]
fn xgboost_nan_follows_default_direction() {
    assert_eq!(one(&xgb_numeric(true), &[f32::NAN, 0.0]), 1.0);
    assert_eq!(one(&xgb_numeric(false), &[f32::NAN, 0.0]), 2.0);
    assert_eq!(one(&xgb_categorical(true), &[0.0, f32::NAN]), 1.0);
    assert_eq!(one(&xgb_categorical(false), &[0.0, f32::NAN]), 2.0);
}

#[test]
fn xgboost_categories_in_the_set_go_right() {
    let f = xgb_categorical(true);
    assert_eq!(f.categorical_features(), &[1]);
    for (code, want) in [
        (0.0, 2.0),  // in
        (5.0, 2.0),  // in
        (5.7, 2.0),  // truncated to 5
        (40.0, 2.0), // in, second bitset word
        (3.0, 1.0),  // out
        (41.0, 1.0), // out
        (64.0, 1.0), // beyond the bitset: unseen goes left
        (1e9, 1.0),  // far beyond
        (-1.0, 1.0), // negative: invalid goes left
        (-0.5, 1.0), // negative (not truncated to 0 as LightGBM would)
        (-0.0, 2.0), // is 0
    ] {
        assert_eq!(one(&f, &[0.0, code]), want, "code {code}");
    }
}

#[test]
fn xgboost_logistic_base_score_is_a_probability() {
    // base_score 0.2 and one leaf of 0: the output must be 0.2 itself.
    let t = xgb_tree(&[-1], &[-1], &[0], &[0.0], &[0], &[0], &[], &[]);
    let json = xgb_model(
        "binary:logistic",
        "[2E-1]",
        "gbtree",
        "[3,2,0]",
        std::slice::from_ref(&t),
    );
    let f = Forest::from_xgboost_json(json.as_bytes()).expect("load");
    assert!((one(&f, &[0.0, 0.0]) - 0.2).abs() < 1e-7);
    // logitraw keeps base_score as a margin (XGBoost 3.2 does not take its logit).
    let json = xgb_model("binary:logitraw", "[2E-1]", "gbtree", "[3,2,0]", &[t]);
    let f = Forest::from_xgboost_json(json.as_bytes()).expect("load");
    assert_eq!(one(&f, &[0.0, 0.0]), 0.2);
}

fn xgb_refusal(json: &str) -> String {
    match Forest::from_xgboost_json(json.as_bytes()) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

fn leaf_tree() -> String {
    xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[0, 0, 0],
        &[0.5, 1.0, 2.0],
        &[0, 0, 0],
        &[0, 0, 0],
        &[],
        &[],
    )
}

#[test]
fn xgboost_refusals_name_what_is_wrong() {
    let e = xgb_refusal(&xgb_model(
        "reg:pseudohubererror",
        "[0E0]",
        "gbtree",
        "[3,2,0]",
        &[leaf_tree()],
    ));
    assert!(e.contains("objective \"reg:pseudohubererror\""), "{e}");
    let e = xgb_refusal(&xgb_model(
        "multi:softmax",
        "[0E0]",
        "gbtree",
        "[3,2,0]",
        &[leaf_tree()],
    ));
    assert!(e.contains("multi:softmax"), "{e}");
    let e = xgb_refusal(&xgb_model(
        "reg:squarederror",
        "[0E0]",
        "dart",
        "[3,2,0]",
        &[leaf_tree()],
    ));
    assert!(e.contains("DART"), "{e}");
    let e = xgb_refusal(&xgb_model(
        "reg:squarederror",
        "[0E0]",
        "gblinear",
        "[3,2,0]",
        &[leaf_tree()],
    ));
    assert!(e.contains("gblinear"), "{e}");
    let e = xgb_refusal(&xgb_model(
        "reg:squarederror",
        "[0E0]",
        "gbtree",
        "[1,7,0]",
        &[leaf_tree()],
    ));
    assert!(e.contains("version 1.7"), "{e}");
    let e = xgb_refusal("{\"learner\": 3");
    assert!(e.starts_with("malformed XGBoost JSON"), "{e}");
}

#[test]
fn xgboost_broken_trees_are_refused() {
    let model = |t: String| xgb_model("reg:squarederror", "[0E0]", "gbtree", "[3,2,0]", &[t]);
    // Child out of range.
    let e = xgb_refusal(&model(xgb_tree(
        &[7, -1, -1],
        &[8, -1, -1],
        &[0, 0, 0],
        &[0.5, 1.0, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("left child 7"), "{e}");
    // Cycle: node 1 points back to the root.
    let e = xgb_refusal(&model(xgb_tree(
        &[1, 0, -1],
        &[2, 1, -1],
        &[0, 0, 0],
        &[0.5, 0.5, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("reached twice"), "{e}");
    // Right child not left + 1.
    let e = xgb_refusal(&model(xgb_tree(
        &[2, -1, -1],
        &[1, -1, -1],
        &[0, 0, 0],
        &[0.5, 1.0, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("left + 1"), "{e}");
    // Feature index >= num_feature.
    let e = xgb_refusal(&model(xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[2, 0, 0],
        &[0.5, 1.0, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("feature 2"), "{e}");
    // Non-finite leaf (1e39 overflows f32).
    let e = xgb_refusal(&model(xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[0, 0, 0],
        &[0.5, 1e39, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("non-finite value"), "{e}");
    // Array lengths disagree with num_nodes.
    let e = xgb_refusal(&model(xgb_tree(
        &[1, -1],
        &[2, -1, -1],
        &[0, 0, 0],
        &[0.5, 1.0, 2.0],
        &[0; 3],
        &[0; 3],
        &[],
        &[],
    )));
    assert!(e.contains("has 3 entries, num_nodes is 2"), "{e}");
    // A category beyond 2^24 (would need a huge bitset).
    let e = xgb_refusal(&model(xgb_tree(
        &[1, -1, -1],
        &[2, -1, -1],
        &[1, 0, 0],
        &[0.0, 1.0, 2.0],
        &[0; 3],
        &[1, 0, 0],
        &[1 << 30],
        &[0],
    )));
    assert!(e.contains("category 1073741824"), "{e}");
}

#[test]
fn xgboost_string_categories_are_refused() {
    let json = xgb_model("reg:squarederror", "[0E0]", "gbtree", "[3,2,0]", &[leaf_tree()]).replace(
        "\"iteration_indptr\"",
        r#""cats":{"enc":[{"offsets":[],"values":[]},{"offsets":[0,2,4],"values":[3,4]}]},"iteration_indptr""#,
    );
    let e = xgb_refusal(&json);
    assert!(e.contains("category encoding of feature 1 (c)"), "{e}");
}

// ---------------------------------------------------------------- LightGBM helpers

fn lgb_model(objective: &str, trees: &[String]) -> String {
    let mut s = format!(
        "tree\nversion=v4\nnum_class=1\nnum_tree_per_iteration=1\nlabel_index=0\nmax_feature_idx=1\n\
         objective={objective}\nfeature_names=x c\nfeature_infos=[-1:1] 0:1:2\n\n"
    );
    for (i, t) in trees.iter().enumerate() {
        s.push_str(&format!("Tree={i}\n{t}\n\n"));
    }
    s.push_str("end of trees\n\nparameters:\n[linear_tree: 0]\nend of parameters\n\npandas_categorical:null\n");
    s
}

/// One split on x: left leaf 1.0, right leaf 2.0.
fn lgb_numeric_tree(threshold: &str, decision_type: u8) -> String {
    format!(
        "num_leaves=2\nnum_cat=0\nsplit_feature=0\nsplit_gain=1\nthreshold={threshold}\ndecision_type={decision_type}\n\
         left_child=-1\nright_child=-2\nleaf_value=1 2\nleaf_weight=1 1\nleaf_count=1 1\ninternal_value=0\n\
         internal_weight=0\ninternal_count=2\nis_linear=0\nshrinkage=1"
    )
}

fn lgb(objective: &str, trees: &[String]) -> Forest {
    Forest::from_lightgbm_text(&lgb_model(objective, trees)).expect("load")
}

#[test]
fn lightgbm_numeric_is_less_or_equal_in_f64() {
    let f = lgb("regression", &[lgb_numeric_tree("0.5", 0)]);
    assert_eq!(
        one(&f, &[0.5, 0.0]),
        1.0,
        "equal to the threshold goes left"
    );
    assert_eq!(
        one(&f, &[0.500_000_06, 0.0]),
        2.0,
        "the f32 above goes right"
    );
    // 0.1 is not an f32: 0.1f32 is above it (right), the f32 below is under it (left).
    let f = lgb("regression", &[lgb_numeric_tree("0.10000000000000001", 0)]);
    assert_eq!(one(&f, &[0.1, 0.0]), 2.0);
    assert_eq!(one(&f, &[0.099_999_994, 0.0]), 1.0);
    // A threshold of +inf (written by LightGBM for "missing or not" splits): all
    // non-missing values go left, +inf included; NaN (missing type NaN, default right) right.
    let f = lgb("regression", &[lgb_numeric_tree("inf", 8)]);
    assert_eq!(one(&f, &[f32::INFINITY, 0.0]), 1.0);
    assert_eq!(one(&f, &[1e30, 0.0]), 1.0);
    assert_eq!(one(&f, &[f32::NAN, 0.0]), 2.0);
}

#[test]
fn lightgbm_missing_type_nan_uses_default_left_bit() {
    // decision_type 8: missing NaN, default right; 10: missing NaN, default left.
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("-0.5", 8)]),
            &[f32::NAN, 0.0]
        ),
        2.0
    );
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("0.5", 10)]),
            &[f32::NAN, 0.0]
        ),
        1.0
    );
    // 0.0 is an ordinary value under missing type NaN.
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("-0.5", 10)]),
            &[0.0, 0.0]
        ),
        2.0
    );
}

#[test]
fn lightgbm_missing_type_none_reads_nan_as_zero() {
    // decision_type 2: missing none (default-left bit set but unused). NaN is 0.0.
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("0.5", 2)]),
            &[f32::NAN, 0.0]
        ),
        1.0
    );
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("-0.5", 2)]),
            &[f32::NAN, 0.0]
        ),
        2.0
    );
    assert_eq!(
        one(
            &lgb("regression", &[lgb_numeric_tree("0", 0)]),
            &[f32::NAN, 0.0]
        ),
        1.0
    );
}

#[test]
fn lightgbm_missing_type_zero_sends_zero_and_nan_the_default_way() {
    // decision_type 4: missing zero, default right; 6: missing zero, default left.
    let right = lgb("regression", &[lgb_numeric_tree("0.5", 4)]);
    let left = lgb("regression", &[lgb_numeric_tree("-0.5", 6)]);
    for x in [0.0, -0.0, f32::NAN, 1e-36, -1e-35] {
        assert_eq!(one(&right, &[x, 0.0]), 2.0, "x = {x}");
        assert_eq!(one(&left, &[x, 0.0]), 1.0, "x = {x}");
    }
    assert_eq!(one(&right, &[0.25, 0.0]), 1.0, "a non-zero value compares");
    assert_eq!(
        one(&left, &[2e-35, 0.0]),
        2.0,
        "just above kZeroThreshold is not zero"
    );
}

#[test]
fn lightgbm_snaps_tiny_inputs_to_zero() {
    // Threshold -1e-35 (= -kZeroThreshold): x = -1e-35 reads as 0.0, which is above it.
    let f = lgb(
        "regression",
        &[lgb_numeric_tree("-1.0000000180025095e-35", 0)],
    );
    assert_eq!(one(&f, &[-1e-35, 0.0]), 2.0);
    assert_eq!(one(&f, &[-2e-35, 0.0]), 1.0);
}

fn lgb_cat_tree() -> String {
    // Set {0, 2, 40} on feature 1 (two bitset words: 0b101 and 1 << 8).
    "num_leaves=2\nnum_cat=1\nsplit_feature=1\nsplit_gain=1\nthreshold=0\ndecision_type=1\nleft_child=-1\n\
     right_child=-2\nleaf_value=1 2\nleaf_weight=1 1\nleaf_count=1 1\ninternal_value=0\ninternal_weight=0\n\
     internal_count=2\ncat_boundaries=0 2\ncat_threshold=5 256\nis_linear=0\nshrinkage=1"
        .to_owned()
}

#[test]
fn lightgbm_categories_in_the_set_go_left() {
    let f = lgb("regression", &[lgb_cat_tree()]);
    assert_eq!(f.categorical_features(), &[1]);
    for (code, want) in [
        (0.0, 1.0),
        (2.0, 1.0),
        (2.9, 1.0),  // truncated to 2
        (40.0, 1.0), // second word
        (1.0, 2.0),
        (41.0, 2.0),
        (64.0, 2.0), // beyond the bitset
        (3e9, 2.0),
        (f32::NAN, 2.0), // NaN goes right
        (-1.0, 2.0),     // negative goes right
        (-0.5, 1.0),     // truncates to 0, which is in the set
    ] {
        assert_eq!(one(&f, &[0.0, code]), want, "code {code}");
    }
}

#[test]
fn lightgbm_sigmoid_scale() {
    let f = lgb("binary sigmoid:2", &[lgb_numeric_tree("0.5", 0)]);
    let want = 1.0 / (1.0 + (-2.0f64 * 2.0).exp());
    assert!((f64::from(one(&f, &[1.0, 0.0])) - want).abs() < 1e-7);
}

fn lgb_refusal(text: &str) -> String {
    match Forest::from_lightgbm_text(text) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn lightgbm_refusals_name_what_is_wrong() {
    let t = lgb_numeric_tree("0.5", 0);
    let e = lgb_refusal(&lgb_model("lambdarank", std::slice::from_ref(&t)));
    assert!(e.contains("objective \"lambdarank\""), "{e}");
    let e = lgb_refusal(&lgb_model("regression sqrt", std::slice::from_ref(&t)));
    assert!(e.contains("sqrt"), "{e}");
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("is_linear=0", "is_linear=1")],
    ));
    assert!(e.contains("linear trees"), "{e}");
    let e = lgb_refusal(
        &lgb_model("regression", std::slice::from_ref(&t))
            .replace("[linear_tree: 0]", "[linear_tree: 1]"),
    );
    assert!(e.contains("linear trees"), "{e}");
    let e = lgb_refusal(
        &lgb_model("regression", std::slice::from_ref(&t)).replace("version=v4", "version=v3"),
    );
    assert!(e.contains("version \"v3\""), "{e}");
    let e = lgb_refusal(
        &lgb_model("regression", std::slice::from_ref(&t))
            .replace("objective=", "average_output\nobjective="),
    );
    assert!(e.contains("average_output"), "{e}");
    let e = lgb_refusal(&lgb_model("regression", &[t]).replace(
        "pandas_categorical:null",
        r#"pandas_categorical:[["a","b"]]"#,
    ));
    assert!(e.contains("pandas_categorical"), "{e}");
}

#[test]
fn lightgbm_broken_trees_are_refused() {
    let t = lgb_numeric_tree("0.5", 0);
    // Leaf child out of range.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("right_child=-2", "right_child=-9")],
    ));
    assert!(e.contains("leaf child -9"), "{e}");
    // Split child out of range.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("right_child=-2", "right_child=3")],
    ));
    assert!(e.contains("child 3"), "{e}");
    // Cycle: the root is its own child.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("right_child=-2", "right_child=0")],
    ));
    assert!(e.contains("reached twice"), "{e}");
    // Feature index >= num features.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("split_feature=0", "split_feature=2")],
    ));
    assert!(e.contains("feature 2"), "{e}");
    // Non-finite leaf, NaN threshold.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("leaf_value=1 2", "leaf_value=1 inf")],
    ));
    assert!(e.contains("non-finite value"), "{e}");
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("threshold=0.5", "threshold=nan")],
    ));
    assert!(e.contains("NaN threshold"), "{e}");
    // Array shorter than num_leaves says.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("leaf_value=1 2", "leaf_value=1")],
    ));
    assert!(e.contains("leaf_value has 1 values, expected 2"), "{e}");
    // An absurd num_leaves is refused before anything is allocated for it.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("num_leaves=2", "num_leaves=4000000000")],
    ));
    assert!(e.contains("exceeds a limit"), "{e}");
    // Categorical set index out of range.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[lgb_cat_tree().replace("threshold=0", "threshold=3")],
    ));
    assert!(e.contains("set index 3"), "{e}");
    // Bad decision type, and garbage.
    let e = lgb_refusal(&lgb_model(
        "regression",
        &[t.replace("decision_type=0", "decision_type=12")],
    ));
    assert!(e.contains("missing type 3"), "{e}");
    let e = lgb_refusal("not a model");
    assert!(e.starts_with("malformed LightGBM text"), "{e}");
}

#[test]
fn errors_are_one_type() {
    // Refusals are values of the one error enum, matchable by kind.
    let e = Forest::from_lightgbm_text(&lgb_model("lambdarank", &[lgb_numeric_tree("0.5", 0)]))
        .expect_err("refused");
    assert!(matches!(e, TreeError::Unsupported { .. }), "{e:?}");
}
