#![allow(clippy::unwrap_used, clippy::manual_is_multiple_of)]
#![allow(dead_code)]
use mesh_prediction_log::{source, FeatureUsed, PredictionRecord, Role, StageMicros};

/// A realistic record: two entity keys, four features, stage timings that add up to less
/// than the total.
pub fn record(i: u64, version: &str, role: Role) -> PredictionRecord {
    let mut r = PredictionRecord::new(format!("req-{i:08}"), "fraud", version, role);
    r.entity_keys = vec![
        ("card_id".into(), format!("c-{}", i % 97)),
        ("merchant_id".into(), format!("m-{}", i % 13)),
    ];
    r.features = Some(
        (0..4)
            .map(|f| FeatureUsed {
                name: format!("f{f}").into(),
                value: if f == 3 && i % 5 == 0 {
                    None
                } else {
                    Some(i as f64 * 0.5 + f as f64)
                },
                status: if f == 3 && i % 5 == 0 {
                    "NOT_FOUND".into()
                } else {
                    "PRESENT".into()
                },
                event_time_us: if f == 3 && i % 5 == 0 {
                    None
                } else {
                    Some(r.ts_us - 1_000_000)
                },
            })
            .collect(),
    );
    r.score = if i % 11 == 0 {
        None
    } else {
        Some((i % 100) as f64 / 100.0)
    };
    r.decision = match i % 3 {
        0 => Some("approve".into()),
        1 => Some("review".into()),
        _ => None,
    };
    r.source = if i % 17 == 0 {
        source::RULES.into()
    } else {
        source::MODEL.into()
    };
    let s = StageMicros {
        validate: 3 + i % 4,
        features: 20 + i % 40,
        preprocess: 5,
        queue: 50 + i % 100,
        compute: 30 + i % 10,
        postprocess: 2,
        total: 0,
    };
    r.stages = StageMicros {
        total: s.sum_of_stages() + i % 7,
        ..s
    };
    r
}

/// Field `i` (1-based, as in proc(5)) of a thread's /proc stat line.
pub fn stat_field(task: &std::path::Path, i: usize) -> i64 {
    let stat = std::fs::read_to_string(task.join("stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[i - 3].parse().unwrap()
}
