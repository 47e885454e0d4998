//! A deployment's canary and shadow that are other models, of any kind (an MLP
//! primary with an XGBoost canary, say): their input specs beside the primary's,
//! the one feature lookup that serves them all, and which requests the canary
//! model decides. The same-model canary and shadow (versions of the deployment's
//! model) are routed by `fallback::route` and `fallback::shadow_target`.
use std::sync::Arc;

use super::config::ModelArm;
use super::spec::DecisionSpec;

/// The other-model canary and shadow of one deployment, each with its model's
/// input spec (absent when the deployment has none, or its model is not served).
#[derive(Default)]
pub struct Arms {
    pub canary: Option<(ModelArm, Arc<DecisionSpec>)>,
    pub shadow: Option<(ModelArm, Arc<DecisionSpec>)>,
}

impl Arms {
    fn specs(&self) -> impl Iterator<Item = &DecisionSpec> {
        self.canary
            .iter()
            .chain(&self.shadow)
            .map(|(_, s)| s.as_ref())
    }

    /// The spec whose store features the batch's one lookup reads: the primary's
    /// with the arms' features added, or `None` when they add nothing (the primary's
    /// spec is the lookup's). Each model then reads its own columns by name.
    pub fn lookup_spec(&self, primary: &DecisionSpec) -> Option<DecisionSpec> {
        let mut merged: Option<DecisionSpec> = None;
        for s in self.specs() {
            for f in s.store_features.iter() {
                let have = merged.as_ref().unwrap_or(primary);
                if !have.store_features.contains(f) {
                    let m = merged.get_or_insert_with(|| primary.clone());
                    let mut features = m.store_features.to_vec();
                    features.push(f.clone());
                    m.store_features = features.into();
                }
            }
            for v in &s.views {
                if !merged.as_ref().unwrap_or(primary).views.contains(v) {
                    merged
                        .get_or_insert_with(|| primary.clone())
                        .views
                        .insert(v.clone());
                }
            }
        }
        merged
    }

    /// The canary model that decides this request, if any: never a request that
    /// pins a version (that is the primary model's), else when `draw()`, uniform in
    /// [0, 1), falls under the canary's weight.
    pub fn canary_for(
        &self,
        pinned: Option<u64>,
        draw: impl FnOnce() -> f64,
    ) -> Option<&(ModelArm, Arc<DecisionSpec>)> {
        let c = self.canary.as_ref()?;
        (pinned.is_none() && draw() < c.0.weight).then_some(c)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decide::testing;

    fn arm(model: &str, weight: f64) -> ModelArm {
        ModelArm {
            model: model.into(),
            version: None,
            weight,
        }
    }

    #[test]
    fn the_lookup_reads_every_models_features_once() {
        let primary = testing::spec();
        assert!(Arms::default().lookup_spec(&primary).is_none());
        // An arm that reads nothing new adds nothing.
        let same = Arms {
            canary: Some((arm("x", 0.5), Arc::new(testing::spec()))),
            shadow: None,
        };
        assert!(same.lookup_spec(&primary).is_none());
        let mut other = testing::spec();
        other.store_features = vec!["merchant:risk".into(), "card:f31".into()].into();
        other.views.insert("merchant".into());
        let arms = Arms {
            canary: None,
            shadow: Some((arm("y", 1.0), Arc::new(other))),
        };
        let merged = arms.lookup_spec(&primary).unwrap();
        assert_eq!(&*merged.store_features, ["card:f31", "merchant:risk"]);
        assert_eq!(
            merged.views.iter().map(String::as_str).collect::<Vec<_>>(),
            ["card", "merchant"]
        );
        // The primary's own entries and thresholds are unchanged.
        assert_eq!(merged.entries.len(), primary.entries.len());
    }

    #[test]
    fn the_canary_takes_its_weight_of_unpinned_requests() {
        let arms = Arms {
            canary: Some((arm("xgb", 0.25), Arc::new(testing::spec()))),
            shadow: None,
        };
        assert_eq!(arms.canary_for(None, || 0.1).unwrap().0.model, "xgb");
        assert!(arms.canary_for(None, || 0.25).is_none());
        assert!(arms.canary_for(Some(1), || 0.0).is_none());
        assert!(Arms::default().canary_for(None, || 0.0).is_none());
    }
}
