//! `mesh decide`: one transaction, by hand, against a running mesh
//! (`mesh.v1.Decisions/Decide`), from flags or from JSON; prints the answer.
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use mesh_proto::mesh::v1 as pb;
use pb::decisions_client::DecisionsClient;
use serde_json::{json, Map, Value};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples (the demo's keys: cards 1..=10000, merchants m000001..m001000):
  mesh decide --card-id 17 --merchant-id m000017 --feature amount=42.5 --feature merchant_category=travel
  mesh decide --json '{\"model\": \"fraud_mlp\", \"entities\": {\"card_id\": 17, \"merchant_id\": \"m000017\"},
                      \"features\": {\"amount\": 42.5}, \"categorical\": {\"merchant_category\": \"travel\"}}'
  echo '{...}' | mesh decide --json -")]
pub struct DecideArgs {
    /// gRPC address of the mesh.
    #[arg(long, env = "MESH_ADDR", default_value = "http://127.0.0.1:8001")]
    pub addr: String,
    /// The model that decides.
    #[arg(long, default_value = "fraud_mlp")]
    pub model: String,
    /// A version to pin (default: the deployment's routing).
    #[arg(long)]
    pub version: Option<String>,
    /// Request id (default: `cli-<unix millis>`).
    #[arg(long)]
    pub request_id: Option<String>,
    /// Entity key `card_id` (int64).
    #[arg(long)]
    pub card_id: Option<i64>,
    /// Entity key `merchant_id` (string, e.g. m000017).
    #[arg(long)]
    pub merchant_id: Option<String>,
    /// Another entity key, NAME=VALUE: a whole number is an int64 key, anything
    /// else a string key (repeatable).
    #[arg(long = "entity", value_name = "NAME=VALUE")]
    pub entities: Vec<String>,
    /// A request feature, NAME=VALUE: a number is numeric, anything else
    /// categorical (repeatable).
    #[arg(long = "feature", value_name = "NAME=VALUE")]
    pub features: Vec<String>,
    /// The whole request as JSON instead of the flags above (fields of
    /// mesh.v1.DecideRequest; entity keys as numbers or strings); `-` reads stdin,
    /// `@FILE` reads a file.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["card_id", "merchant_id", "entities", "features"])]
    pub json: Option<String>,
    /// Print the answer as one JSON object instead of text.
    #[arg(long)]
    pub print_json: bool,
    /// Deadline of the call, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

fn split(kv: &str) -> anyhow::Result<(&str, &str)> {
    match kv.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k, v)),
        _ => bail!("'{kv}' is not NAME=VALUE"),
    }
}

fn entity_key(v: &str) -> pb::EntityKey {
    use pb::entity_key::Key;
    let key = match v.parse::<i64>() {
        Ok(i) => Key::Int64Key(i),
        Err(_) => Key::StringKey(v.to_owned()),
    };
    pb::EntityKey { key: Some(key) }
}

fn default_request_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("cli-{ms}")
}

/// The request the flags describe.
pub fn from_flags(a: &DecideArgs) -> anyhow::Result<pb::DecideRequest> {
    use pb::entity_key::Key;
    let mut r = pb::DecideRequest {
        request_id: a.request_id.clone().unwrap_or_else(default_request_id),
        model: a.model.clone(),
        version: a.version.clone().unwrap_or_default(),
        ..Default::default()
    };
    if let Some(c) = a.card_id {
        r.entities.insert(
            "card_id".into(),
            pb::EntityKey {
                key: Some(Key::Int64Key(c)),
            },
        );
    }
    if let Some(m) = &a.merchant_id {
        r.entities.insert(
            "merchant_id".into(),
            pb::EntityKey {
                key: Some(Key::StringKey(m.clone())),
            },
        );
    }
    for e in &a.entities {
        let (k, v) = split(e).context("--entity")?;
        r.entities.insert(k.to_owned(), entity_key(v));
    }
    for f in &a.features {
        let (k, v) = split(f).context("--feature")?;
        if let Ok(x) = v.parse::<f64>() {
            r.features.insert(k.to_owned(), x);
        } else {
            r.categorical.insert(k.to_owned(), v.to_owned());
        }
    }
    Ok(r)
}

/// The request a JSON object describes: `request_id`, `model`, `version`,
/// `entities` (numbers are int64 keys, strings string keys), `features` (numbers;
/// a string value is taken as categorical) and `categorical` (strings). Missing
/// `model` and `request_id` come from the flags' defaults.
pub fn from_json(text: &str, a: &DecideArgs) -> anyhow::Result<pb::DecideRequest> {
    use pb::entity_key::Key;
    let v: Value = serde_json::from_str(text).context("--json is not valid JSON")?;
    let Value::Object(o) = v else {
        bail!("--json must be a JSON object");
    };
    let known = [
        "request_id",
        "model",
        "version",
        "entities",
        "features",
        "categorical",
    ];
    if let Some(k) = o.keys().find(|k| !known.contains(&k.as_str())) {
        bail!(
            "--json: unknown field '{k}' (expected {})",
            known.join(", ")
        );
    }
    let text_of = |k: &str| -> anyhow::Result<Option<String>> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) if k == "version" => Ok(Some(n.to_string())),
            Some(other) => bail!("--json: '{k}' must be a string, not {other}"),
        }
    };
    let table = |k: &str| -> anyhow::Result<Map<String, Value>> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(Map::new()),
            Some(Value::Object(m)) => Ok(m.clone()),
            Some(other) => bail!("--json: '{k}' must be an object, not {other}"),
        }
    };
    let mut r = pb::DecideRequest {
        request_id: text_of("request_id")?
            .or_else(|| a.request_id.clone())
            .unwrap_or_else(default_request_id),
        model: text_of("model")?.unwrap_or_else(|| a.model.clone()),
        version: text_of("version")?
            .or_else(|| a.version.clone())
            .unwrap_or_default(),
        ..Default::default()
    };
    for (k, v) in table("entities")? {
        let key = match v {
            Value::Number(n) => Key::Int64Key(
                n.as_i64()
                    .with_context(|| format!("--json: entity '{k}' = {n} is not an int64"))?,
            ),
            Value::String(s) => Key::StringKey(s),
            other => bail!("--json: entity '{k}' must be a number or a string, not {other}"),
        };
        r.entities.insert(k, pb::EntityKey { key: Some(key) });
    }
    for (k, v) in table("features")? {
        match v {
            Value::Number(n) => {
                let x = n.as_f64().context("--json: a feature is not a number")?;
                r.features.insert(k, x);
            }
            Value::String(s) => {
                r.categorical.insert(k, s);
            }
            other => bail!("--json: feature '{k}' must be a number or a string, not {other}"),
        }
    }
    for (k, v) in table("categorical")? {
        match v {
            Value::String(s) => r.categorical.insert(k, s),
            other => bail!("--json: categorical '{k}' must be a string, not {other}"),
        };
    }
    Ok(r)
}

fn read_json_arg(s: &str) -> anyhow::Result<String> {
    if s == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the request from stdin")?;
        Ok(text)
    } else if let Some(path) = s.strip_prefix('@') {
        let p = PathBuf::from(path);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    } else {
        Ok(s.to_owned())
    }
}

/// The answer as JSON (decision and source spelled as in the proto).
pub fn answer_json(r: &pb::DecideResponse) -> Value {
    let decision = pb::Decision::try_from(r.decision)
        .map(|d| d.as_str_name().trim_start_matches("DECISION_").to_owned())
        .unwrap_or_else(|_| r.decision.to_string());
    let source = pb::AnswerSource::try_from(r.source)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ANSWER_SOURCE_")
                .to_owned()
        })
        .unwrap_or_else(|_| r.source.to_string());
    let t = r.timings.unwrap_or_default();
    json!({
        "request_id": r.request_id,
        "decision": decision,
        "score": r.score,
        "source": source,
        "model": r.model,
        "model_version": r.model_version,
        "role": r.role,
        "reasons": r.reasons,
        "timings_us": {
            "validate": t.validate_us, "features": t.features_us, "preprocess": t.preprocess_us,
            "queue": t.queue_us, "compute": t.compute_us, "postprocess": t.postprocess_us,
            "total": t.total_us,
        },
    })
}

/// The answer for a person.
pub fn answer_text(r: &pb::DecideResponse) -> String {
    let j = answer_json(r);
    let score = r.score.map_or("none".to_owned(), |s| format!("{s:.4}"));
    let version = if r.model_version.is_empty() {
        String::new()
    } else {
        format!(" v{}", r.model_version)
    };
    let mut out = format!(
        "{}  score {score}  source {}  model {}{version} ({})  request {}\n",
        j["decision"].as_str().unwrap_or_default(),
        j["source"].as_str().unwrap_or_default(),
        r.model,
        r.role,
        r.request_id
    );
    for reason in &r.reasons {
        out += &format!("  - {reason}\n");
    }
    let t = r.timings.unwrap_or_default();
    out += &format!(
        "  us: validate {} features {} preprocess {} queue {} compute {} postprocess {} total {}\n",
        t.validate_us,
        t.features_us,
        t.preprocess_us,
        t.queue_us,
        t.compute_us,
        t.postprocess_us,
        t.total_us
    );
    out
}

/// `mesh decide`.
pub async fn run(a: DecideArgs) -> anyhow::Result<()> {
    let req = match &a.json {
        Some(s) => from_json(&read_json_arg(s)?, &a)?,
        None => from_flags(&a)?,
    };
    let mut client = DecisionsClient::connect(a.addr.clone())
        .await
        .with_context(|| format!("connecting to the mesh at {}", a.addr))?;
    let mut request = tonic::Request::new(req);
    request.set_timeout(std::time::Duration::from_millis(a.timeout_ms));
    let r = client
        .decide(request)
        .await
        .map_err(|s| anyhow::anyhow!("Decide failed: {:?}: {}", s.code(), s.message()))?
        .into_inner();
    if a.print_json {
        crate::outln!("{}", serde_json::to_string_pretty(&answer_json(&r))?)?;
    } else {
        crate::out!("{}", answer_text(&r))?;
    }
    Ok(())
}
