//! The view registry recorded in the database (tree `registry`).
//!
//! Every view the store has ever served is recorded with a stable numeric id (the
//! key prefix of its rows) and every feature with a stable id (its field tag in the
//! value encoding). On open the views file is reconciled with the record:
//! - a new view gets the next view id; a new feature gets the next feature id of
//!   its view, so adding features never rewrites stored rows;
//! - a feature dropped from the file is kept in the record as retired, so its id is
//!   never reused for different data;
//! - max_age and the timestamp field may change freely (they are read-time rules);
//! - a changed entity key type, or a changed type of a live feature, is refused:
//!   stored bytes would be misread. That needs a rebuild from source files.
use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ViewConfig, ViewsConfig};
use crate::encoding::ENCODING_VERSION;
use crate::error::{FeatureStoreError, Result};
use crate::types::{FeatureType, KeyType};

pub const REGISTRY_TREE: &str = "registry";
const KEY_NEXT_VIEW_ID: &[u8] = b"next_view_id";
const KEY_ENCODING: &[u8] = b"encoding_version";
const VIEW_KEY_PREFIX: &str = "view:";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecordedFeature {
    id: u16,
    name: String,
    dtype: FeatureType,
    retired: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecordedView {
    id: u32,
    name: String,
    entity: String,
    join_key: String,
    key_type: KeyType,
    max_age_micros: u64,
    timestamp_field: String,
    features: Vec<RecordedFeature>,
    retired: bool,
}

/// A live feature of a view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureInfo {
    /// Stable id: the field tag in stored values.
    pub id: u16,
    pub name: String,
    pub dtype: FeatureType,
}

/// A live view: what the views file declares, with the ids the store recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewInfo {
    /// Stable id: the key prefix of this view's rows.
    pub id: u32,
    pub name: String,
    pub entity: String,
    pub join_key: String,
    pub key_type: KeyType,
    pub max_age: Duration,
    pub timestamp_field: String,
    /// Live features in the views file's order; [`crate::Row::values`] aligns to it.
    pub features: Vec<FeatureInfo>,
}

impl ViewInfo {
    pub fn feature_index(&self, name: &str) -> Option<usize> {
        self.features.iter().position(|f| f.name == name)
    }

    pub(crate) fn max_age_micros(&self) -> i64 {
        i64::try_from(self.max_age.as_micros()).unwrap_or(i64::MAX)
    }
}

/// What a store has recorded: every view it ever served, the next view id, and
/// the value encoding it was written with. sled keeps it in the `registry` tree,
/// Redis in one key (`<prefix>:registry`, JSON of this struct).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct Recorded {
    /// `None` for a store never opened before.
    pub encoding: Option<u8>,
    pub next_view_id: u32,
    pub views: Vec<RecordedView>,
}

/// Reconciles `config` with the registry in `db`, records the result, and returns
/// the live views in the file's order.
pub fn reconcile(
    db: &sled::Db,
    config: &ViewsConfig,
    path: &std::path::Path,
) -> Result<Vec<ViewInfo>> {
    let tree = db.open_tree(REGISTRY_TREE)?;
    let corrupt = |detail: String| FeatureStoreError::Open {
        path: path.to_path_buf(),
        kind: crate::error::OpenFailure::Corrupt,
        detail,
    };
    let mut recorded = Recorded {
        encoding: tree
            .get(KEY_ENCODING)?
            .map(|v| v.first().copied().unwrap_or(0)),
        next_view_id: 1,
        views: Vec::new(),
    };
    for item in tree.scan_prefix(VIEW_KEY_PREFIX.as_bytes()) {
        let (k, v) = item?;
        let rv: RecordedView = serde_json::from_slice(&v).map_err(|e| {
            corrupt(format!(
                "registry entry {:?} is unreadable: {e}",
                String::from_utf8_lossy(&k)
            ))
        })?;
        recorded.views.push(rv);
    }
    if let Some(v) = tree.get(KEY_NEXT_VIEW_ID)? {
        recorded.next_view_id = u32::from_be_bytes(
            v.as_ref()
                .try_into()
                .map_err(|_| corrupt("registry next_view_id is malformed".into()))?,
        );
    }
    let (live, updated) = reconcile_records(recorded, config)?;

    let mut batch = sled::Batch::default();
    for rv in &updated.views {
        let json =
            serde_json::to_vec(rv).map_err(|e| FeatureStoreError::Internal(e.to_string()))?;
        batch.insert(format!("{VIEW_KEY_PREFIX}{}", rv.name).as_bytes(), json);
    }
    batch.insert(KEY_NEXT_VIEW_ID, &updated.next_view_id.to_be_bytes());
    batch.insert(KEY_ENCODING, &[ENCODING_VERSION]);
    tree.apply_batch(batch)?;
    tree.flush()?;
    Ok(live)
}

/// The reconciliation itself, on any backend's record: the live views in the
/// file's order, and the record to store back.
pub(crate) fn reconcile_records(
    recorded: Recorded,
    config: &ViewsConfig,
) -> Result<(Vec<ViewInfo>, Recorded)> {
    if let Some(v) = recorded.encoding {
        if v != ENCODING_VERSION {
            return Err(FeatureStoreError::RegistryConflict {
                what: format!(
                    "the store was written with value encoding {v}, this build writes {ENCODING_VERSION}"
                ),
            });
        }
    }
    let mut by_name: HashMap<String, RecordedView> = recorded
        .views
        .into_iter()
        .map(|rv| (rv.name.clone(), rv))
        .collect();
    let mut next_view_id = recorded.next_view_id.max(1);
    let mut live = Vec::with_capacity(config.views.len());
    let mut updated: Vec<RecordedView> = Vec::new();
    for vc in &config.views {
        let rv = match by_name.remove(&vc.name) {
            Some(old) => merge_view(old, vc, config)?,
            None => {
                let id = next_view_id;
                next_view_id =
                    next_view_id
                        .checked_add(1)
                        .ok_or_else(|| FeatureStoreError::Config {
                            what: "out of view ids".into(),
                        })?;
                new_view(id, vc, config)?
            }
        };
        live.push(to_info(&rv));
        updated.push(rv);
    }
    // Views no longer in the file stay recorded (their rows and ids are kept) but
    // are not served. Sorted so that the record is the same whatever the map's order.
    let mut retired: Vec<RecordedView> = by_name.into_values().collect();
    retired.sort_by(|a, b| a.name.cmp(&b.name));
    for mut rv in retired {
        rv.retired = true;
        updated.push(rv);
    }
    Ok((
        live,
        Recorded {
            encoding: Some(ENCODING_VERSION),
            next_view_id,
            views: updated,
        },
    ))
}

fn entity_of<'a>(
    vc: &ViewConfig,
    config: &'a ViewsConfig,
) -> Result<&'a crate::config::EntityConfig> {
    config
        .entity(&vc.entity)
        .ok_or_else(|| FeatureStoreError::Config {
            what: format!("view {:?} names unknown entity {:?}", vc.name, vc.entity),
        })
}

fn new_view(id: u32, vc: &ViewConfig, config: &ViewsConfig) -> Result<RecordedView> {
    let entity = entity_of(vc, config)?;
    let features = vc
        .features
        .iter()
        .enumerate()
        .map(|(i, f)| RecordedFeature {
            id: i as u16,
            name: f.name.clone(),
            dtype: f.dtype,
            retired: false,
        })
        .collect();
    Ok(RecordedView {
        id,
        name: vc.name.clone(),
        entity: entity.name.clone(),
        join_key: entity.join_key.clone(),
        key_type: entity.key_type,
        max_age_micros: u64::try_from(vc.max_age.as_micros()).unwrap_or(u64::MAX),
        timestamp_field: vc.timestamp_field.clone(),
        features,
        retired: false,
    })
}

fn merge_view(
    mut old: RecordedView,
    vc: &ViewConfig,
    config: &ViewsConfig,
) -> Result<RecordedView> {
    let entity = entity_of(vc, config)?;
    if old.key_type != entity.key_type {
        return Err(FeatureStoreError::RegistryConflict {
            what: format!(
                "view {:?} was recorded with {} keys, the views file gives entity {:?} {} keys",
                vc.name, old.key_type, entity.name, entity.key_type
            ),
        });
    }
    let mut next_id = old
        .features
        .iter()
        .map(|f| f.id as u32 + 1)
        .max()
        .unwrap_or(0);
    let previously_live: HashMap<String, FeatureType> = old
        .features
        .iter()
        .filter(|f| !f.retired)
        .map(|f| (f.name.clone(), f.dtype))
        .collect();
    for f in &mut old.features {
        f.retired = true;
    }
    for fc in &vc.features {
        if let Some(&was) = previously_live.get(&fc.name) {
            if was != fc.dtype {
                return Err(FeatureStoreError::RegistryConflict {
                    what: format!(
                        "feature {:?} of view {:?} was recorded as {was}, the views file says {}",
                        fc.name, vc.name, fc.dtype
                    ),
                });
            }
        }
        // A live or retired feature of the same name and type keeps its id (and data);
        // a retired one re-declared with another type gets a fresh id.
        match old
            .features
            .iter_mut()
            .find(|f| f.name == fc.name && f.dtype == fc.dtype)
        {
            Some(f) => f.retired = false,
            None => {
                let id = u16::try_from(next_id).map_err(|_| FeatureStoreError::Config {
                    what: format!("view {:?} is out of feature ids", vc.name),
                })?;
                next_id += 1;
                old.features.push(RecordedFeature {
                    id,
                    name: fc.name.clone(),
                    dtype: fc.dtype,
                    retired: false,
                });
            }
        }
    }
    // Keep the file's order for live features, retired ones after them.
    let order: HashMap<&str, usize> = vc
        .features
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.as_str(), i))
        .collect();
    old.features.sort_by_key(|f| {
        if f.retired {
            usize::MAX
        } else {
            order.get(f.name.as_str()).copied().unwrap_or(usize::MAX)
        }
    });
    old.entity = entity.name.clone();
    old.join_key = entity.join_key.clone();
    old.max_age_micros = u64::try_from(vc.max_age.as_micros()).unwrap_or(u64::MAX);
    old.timestamp_field = vc.timestamp_field.clone();
    old.retired = false;
    Ok(old)
}

fn to_info(rv: &RecordedView) -> ViewInfo {
    ViewInfo {
        id: rv.id,
        name: rv.name.clone(),
        entity: rv.entity.clone(),
        join_key: rv.join_key.clone(),
        key_type: rv.key_type,
        max_age: Duration::from_micros(rv.max_age_micros),
        timestamp_field: rv.timestamp_field.clone(),
        features: rv
            .features
            .iter()
            .filter(|f| !f.retired)
            .map(|f| FeatureInfo {
                id: f.id,
                name: f.name.clone(),
                dtype: f.dtype,
            })
            .collect(),
    }
}
