//! Every TOML example in the docs parses with the type it documents: the
//! ```` ```toml ```` blocks of README.md and the crates' READMEs, and those in
//! the `//!` docs of the workspace's sources. A block is a mesh.toml, a
//! model.toml or a views file, told by a first-line marker (`# mesh.toml`,
//! `# model.toml`, `# views.toml`) or else by its first table (or first key).
//! mesh.toml blocks must also use no deprecated spelling.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use mesh_model_actor::ModelConfig;
use mesh_router::config::MeshConfig;
use mesh_router::decide::spec::DecisionSpec;

/// One fenced TOML block: where its fence is, and its text.
struct Block {
    file: PathBuf,
    line: usize,
    text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mesh,
    Model,
    Views,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The TOML blocks of `text`, each line first passed through `strip` (which
/// returns `None` for lines that are not documentation).
fn blocks(file: &Path, text: &str, strip: impl Fn(&str) -> Option<&str>) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let Some(line) = strip(raw) else {
            if let Some((at, _)) = open.take() {
                panic!("{}:{at}: toml block not closed", file.display());
            }
            continue;
        };
        let fence = line.trim_start();
        match &mut open {
            None if fence.starts_with("```toml") => open = Some((i + 1, String::new())),
            None => {}
            Some(_) if fence.starts_with("```") => {
                let (line, text) = open.take().unwrap();
                out.push(Block {
                    file: file.to_path_buf(),
                    line,
                    text,
                });
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    if let Some((at, _)) = open {
        panic!("{}:{at}: toml block not closed", file.display());
    }
    out
}

fn markdown_line(l: &str) -> Option<&str> {
    Some(l)
}

fn markdown_blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    blocks(path, &text, markdown_line)
}

fn module_doc_blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    blocks(path, &text, |l| {
        let l = l.trim_start().strip_prefix("//!")?;
        Some(l.strip_prefix(' ').unwrap_or(l))
    })
}

/// `*/README.md` of the workspace root and README.md itself.
fn readmes() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md")];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    out.extend(
        dirs.into_iter()
            .map(|d| d.join("README.md"))
            .filter(|p| p.is_file()),
    );
    out
}

/// Every `.rs` file under the `src/` of each workspace crate.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for e in std::fs::read_dir(root()).unwrap() {
        let src = e.unwrap().path().join("src");
        if src.is_dir() && src.parent().unwrap().join("Cargo.toml").is_file() {
            walk(&src, &mut out);
        }
    }
    out.sort();
    out
}

fn all_blocks() -> Vec<Block> {
    let mut out: Vec<Block> = readmes().iter().flat_map(|p| markdown_blocks(p)).collect();
    out.extend(sources().iter().flat_map(|p| module_doc_blocks(p)));
    out
}

fn classify(text: &str) -> Result<Kind, String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .peekable();
    if let Some(first) = lines.peek() {
        for (marker, kind) in [
            ("# mesh.toml", Kind::Mesh),
            ("# model.toml", Kind::Model),
            ("# views.toml", Kind::Views),
        ] {
            if first.starts_with(marker) {
                return Ok(kind);
            }
        }
    }
    let Some(l) = lines.find(|l| !l.starts_with('#')) else {
        return Err("empty toml block".into());
    };
    let name = if let Some(t) = l.strip_prefix('[') {
        t.trim_start_matches('[')
            .split([']', '.'])
            .next()
            .unwrap_or("")
            .trim()
    } else {
        l.split('=').next().unwrap_or("").trim()
    };
    match name {
        "server" | "log" | "features" | "prediction_log" | "decisions" => Ok(Kind::Mesh),
        "entities" | "views" => Ok(Kind::Views),
        "kind" | "dtype" | "device" | "platform" | "name" | "inputs" | "outputs" | "mlp"
        | "batching" | "version_policy" | "warmup" | "input_spec" | "decision" => Ok(Kind::Model),
        other => Err(format!(
            "cannot tell which file this is (first table or key {other:?}); \
             start it with `# mesh.toml`, `# model.toml` or `# views.toml`"
        )),
    }
}

/// A model.toml fragment that is only the decision tables gets a model around
/// it whose input is as wide as the spec fills, so the spec itself is checked: an
/// MLP, or a tree model when the spec sends NaN or category codes (every column
/// may be missing, the `categories` entries' columns are categorical).
fn whole_model(text: &str) -> Result<String, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    if table.contains_key("kind") {
        return Ok(text.to_owned());
    }
    let spec = table.get("input_spec");
    let entries = spec
        .and_then(|s| s.get("features"))
        .and_then(|f| f.as_array())
        .cloned()
        .unwrap_or_default();
    let (mut width, mut categorical) = (0usize, Vec::new());
    let mut nan = spec
        .and_then(|s| s.get("on_missing"))
        .is_some_and(|m| m.as_str() == Some("nan"));
    for e in &entries {
        if e.get("categories").is_some() {
            categorical.push(width);
        }
        nan |= e.get("on_missing").and_then(|m| m.as_str()) == Some("nan");
        width += e
            .get("one_hot")
            .and_then(|o| o.as_array())
            .map_or(1, Vec::len);
    }
    let width = width.max(1);
    let model = if nan || !categorical.is_empty() {
        format!("kind = \"xgboost\"\n[trees]\ncategorical = {categorical:?}\nmissing = \"any\"\n")
    } else {
        "kind = \"mlp\"\n[mlp]\nactivations = []\noutput_activation = \"sigmoid\"\n".to_owned()
    };
    Ok(format!(
        "{model}\
         [[inputs]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [{width}]\n\
         [[outputs]]\nname = \"probability\"\ndatatype = \"FP32\"\ndims = [1]\n\
         {text}"
    ))
}

fn check(block: &Block) -> Result<Kind, String> {
    let kind = classify(&block.text)?;
    match kind {
        Kind::Mesh => {
            let cfg: MeshConfig = toml::from_str(&block.text).map_err(|e| e.to_string())?;
            if !cfg.deprecations.is_empty() {
                return Err(format!("deprecated spellings: {:?}", cfg.deprecations));
            }
            cfg.decisions.validate()?;
        }
        Kind::Model => {
            let text = whole_model(&block.text)?;
            let model = ModelConfig::parse(&text, "doc")?;
            DecisionSpec::from_model(&model)?;
        }
        Kind::Views => {
            mesh_feature_store::ViewsConfig::from_toml_str(&block.text)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(kind)
}

#[test]
fn every_toml_block_in_the_docs_parses() {
    let root = root();
    let blocks = all_blocks();
    let mut failures = Vec::new();
    let mut seen: Vec<(String, Kind)> = Vec::new();
    for b in &blocks {
        let file = b
            .file
            .strip_prefix(&root)
            .unwrap_or(&b.file)
            .display()
            .to_string();
        match check(b) {
            Ok(kind) => seen.push((file, kind)),
            Err(e) => failures.push(format!("{file}:{}: {e}", b.line)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} toml blocks do not parse:\n{}",
        failures.len(),
        blocks.len(),
        failures.join("\n")
    );
    // The blocks this test exists for are found (a renamed file or a broken
    // fence would otherwise pass silently).
    for (file, kind) in [
        ("README.md", Kind::Mesh),
        ("stack/README.md", Kind::Mesh),
        ("router/src/config.rs", Kind::Mesh),
        ("router/src/decide/config.rs", Kind::Mesh),
        ("stack/src/config.rs", Kind::Mesh),
        ("router/src/decide/spec.rs", Kind::Model),
        ("model-actor/src/config.rs", Kind::Model),
        ("feature-store/src/config.rs", Kind::Views),
    ] {
        assert!(
            seen.iter().any(|(f, k)| f == file && *k == kind),
            "no {kind:?} toml block found in {file}; found: {seen:?}"
        );
    }
}

#[test]
fn a_broken_block_is_reported_with_its_file_and_line() {
    let file = Path::new("x.md");
    let bs = blocks(
        file,
        "text\n```toml\n[decisions]\ndeadline = \"50ms\"\n```\n\n```toml\n[server]\ngrpc_prot = 1\n```\n",
        markdown_line,
    );
    assert_eq!(bs.len(), 2);
    assert_eq!((bs[0].line, bs[1].line), (2, 7));
    assert!(check(&bs[0]).is_ok());
    let err = check(&bs[1]).unwrap_err();
    assert!(err.contains("grpc_prot"), "{err}");
    // A deprecated spelling in a doc block fails it too.
    let old = Block {
        file: file.into(),
        line: 1,
        text: "[decisions]\ndeadline_ms = 50\n".into(),
    };
    assert!(check(&old).unwrap_err().contains("deprecated"));
    // So does a block nobody can classify.
    let unknown = Block {
        file: file.into(),
        line: 1,
        text: "[router.model_call]\ndeadline = \"80ms\"\n".into(),
    };
    assert!(check(&unknown).unwrap_err().contains("router"));
}
