//! What decoding a Decide request costs the server, and reading its features by name
//! as the decision's feature assembly does: a request shaped like `mesh bench`'s
//! (33 numeric features, two entity keys, one categorical feature), under mimalloc as
//! `mesh serve` runs. The maps are prost's default `HashMap`s; `BTreeMap`s
//! (`btree_map(".mesh.v1.DecideRequest")` in build.rs) measured the same.
//!
//! cargo bench -p mesh-proto --bench decode

use criterion::{criterion_group, criterion_main, Criterion};
use mesh_proto::mesh::v1 as pb;
use prost::Message;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn request() -> pb::DecideRequest {
    pb::DecideRequest {
        request_id: "bench-1".into(),
        model: "fraud".into(),
        features: (0..32)
            .map(|j| (format!("f{j}"), f64::from(j) * 0.031 - 0.5))
            .chain([("amount".to_string(), 123.45)])
            .collect(),
        entities: [
            ("card_id", pb::entity_key::Key::Int64Key(4242)),
            (
                "merchant_id",
                pb::entity_key::Key::StringKey("m000077".into()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), pb::EntityKey { key: Some(v) }))
        .collect(),
        categorical: [("merchant_category".to_string(), "grocery".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn decode(c: &mut Criterion) {
    let wire = request().encode_to_vec();
    let names: Vec<String> = (0..32)
        .map(|j| format!("f{j}"))
        .chain(["amount".to_string()])
        .collect();
    let mut g = c.benchmark_group("decide_request");
    g.bench_function("decode", |b| {
        b.iter(|| pb::DecideRequest::decode(black_box(wire.as_slice())).expect("decode"))
    });
    g.bench_function("decode_and_read", |b| {
        b.iter(|| {
            let r = pb::DecideRequest::decode(black_box(wire.as_slice())).expect("decode");
            let mut sum = 0.0;
            for n in &names {
                sum += r.features.get(n.as_str()).copied().unwrap_or(0.0);
            }
            let keys = u32::from(r.entities.contains_key("card_id"))
                + u32::from(r.entities.contains_key("merchant_id"));
            let cat = r
                .categorical
                .get("merchant_category")
                .map_or(0, String::len);
            (sum, keys, cat)
        })
    });
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
