//! What the feature-store benches share: one view of `FEATURES` f32 features keyed
//! by an int64 entity.
use anyhow::Result;
use mesh_feature_store::ViewsConfig;

/// Features per entity in the bench view.
pub const FEATURES: usize = 16;

/// Entity `entity` (`entity_id`, int64) and view `bench` of f0..f15, max age 7 days.
pub fn views() -> Result<ViewsConfig> {
    let feats: Vec<String> = (0..FEATURES)
        .map(|i| format!("{{ name = \"f{i}\", type = \"f32\" }}"))
        .collect();
    let text = format!(
        "[[entities]]\nname = \"entity\"\njoin_key = \"entity_id\"\nkey_type = \"int64\"\n\n\
         [[views]]\nname = \"bench\"\nentity = \"entity\"\nmax_age = \"7d\"\nfeatures = [{}]\n",
        feats.join(", ")
    );
    Ok(ViewsConfig::from_toml_str(&text)?)
}
