//! Reading a scenario: RON with its own line:column errors, then our checks,
//! each error naming the file, the line and column, and what was expected.

use crate::files::{read_bounded, BoundedReadError};
use std::path::Path;
use std::sync::Arc;

use ron::extensions::Extensions;
use ron::Options;

use super::build::{build, BuildError, Built};
use super::conditions::{apply, conditions};
use super::format::{ModelSpec, Scenario};
use super::library::builtin;
use super::ron_spans::{position, At};
use super::statement::LoopShape;
use super::steps::StepSites;
use super::validate::validate;
use crate::alloc::{AllocConfig, TorchVersion};
use crate::engine::config::TransformersVersion;
use crate::engine::model_lang::Seg;
use crate::engine::{LossKind, ModelKind};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("{file}: cannot read: {reason}")]
    Io { file: String, reason: String },
    #[error("{file}:{line}:{column}: {message}")]
    At {
        file: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{file}: {message}")]
    Field { file: String, message: String },
    #[error("no built-in scenario or file named \"{0}\" (see `vramscope scenarios`)")]
    NotFound(String),
    /// The config a run is asked to replay under (`--conf`).
    #[error("--conf: {0}")]
    Conf(Box<crate::alloc::ConfigError>),
}

/// Larger than any scenario a person writes; the cap keeps a wrong path
/// (`/dev/zero`, a model checkpoint) from reading forever or filling memory.
pub const MAX_SCENARIO_BYTES: u64 = 16 << 20;

pub fn load_file(path: &Path) -> Result<(Scenario, Built), LoadError> {
    let (text, file) = read_scenario_text(path)?;
    load_str(&text, &file)
}

/// A scenario file another file names (a lesson's `scenario:`): it must be
/// a `.ron` file that starts as a scenario does (`Scenario(`), and nothing
/// of another file (`/etc/shadow`) is quoted in the error.
pub fn load_named_file(path: &Path) -> Result<(Scenario, Built), LoadError> {
    let not_scenario = |why: &str| LoadError::Io {
        file: path.display().to_string(),
        reason: format!("{why}: not a scenario file"),
    };
    if path.extension().is_none_or(|e| e != "ron") {
        return Err(not_scenario("its name does not end in .ron"));
    }
    let (text, file) = read_scenario_text(path)?;
    if !starts_as_scenario(&text) {
        return Err(not_scenario("it does not start with `Scenario(`"));
    }
    load_str(&text, &file)
}

/// Whether `text`, past blank lines, comments and `#![…]` attributes, opens
/// with `Scenario(` (or RON's anonymous `(`).
fn starts_as_scenario(text: &str) -> bool {
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("#![") {
            rest = r.split_once(']').map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    rest.strip_prefix("Scenario")
        .unwrap_or(rest)
        .trim_start()
        .starts_with('(')
}

/// A scenario file's text (bounded, regular files only, UTF-8) and its
/// name for errors.
fn read_scenario_text(path: &Path) -> Result<(String, String), LoadError> {
    let file = path.display().to_string();
    let io = |reason: String| LoadError::Io {
        file: file.clone(),
        reason,
    };
    let bytes = read_bounded(path, MAX_SCENARIO_BYTES).map_err(|e| match e {
        BoundedReadError::Io(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            io(format!("{e}: not a scenario file"))
        }
        BoundedReadError::Io(e) => io(e.to_string()),
        BoundedReadError::TooLong => io(format!(
            "longer than {} MiB: not a scenario file",
            MAX_SCENARIO_BYTES >> 20
        )),
    })?;
    let text =
        String::from_utf8(bytes).map_err(|e| not_utf8(e.as_bytes(), &e.utf8_error(), &file))?;
    Ok((text, file))
}

/// Where a file stops being UTF-8 text, as a positioned error.
fn not_utf8(bytes: &[u8], e: &std::str::Utf8Error, file: &str) -> LoadError {
    let good = &bytes[..e.valid_up_to()];
    let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = good.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    // Valid UTF-8 up to here: count characters, not bytes.
    let column = std::str::from_utf8(&good[line_start..]).map_or(0, |s| s.chars().count()) + 1;
    LoadError::At {
        file: file.to_string(),
        line,
        column,
        message: format!(
            "byte 0x{:02x} is not UTF-8 text: a scenario file is UTF-8",
            bytes[e.valid_up_to()]
        ),
    }
}

/// A built-in scenario's name, or a path to a file.
pub fn resolve(name_or_path: &str) -> Result<(Scenario, Built), LoadError> {
    if let Some(b) = builtin(name_or_path) {
        return load_str(b.source, &format!("scenarios/{}.ron", b.name));
    }
    let path = Path::new(name_or_path);
    if path.exists() {
        load_file(path)
    } else {
        Err(LoadError::NotFound(name_or_path.to_string()))
    }
}

/// What a JSON file (a Hugging Face `config.json`, most likely) given where a
/// scenario belongs is told.
const JSON_NOT_A_SCENARIO: &str = "this is JSON (a Hugging Face config.json?), not a scenario. \
A scenario names the config as its model and says how it trains, e.g.\n\
  Scenario(name: \"fit\", description: \"my model\", device: (name: \"H100\", gpu: \"H100-SXM-80GB\"),\n\
      model: HfConfig(\"config.json\"), model_dtype: BF16, data: (batch: 8, seq: 2048),\n\
      steps: [ZeroGrad(set_to_none: true), LoadBatch(x: \"x\", y: \"y\"), Forward(input: \"x\", output: \"out\"),\n\
          Loss(output: \"out\", target: \"y\", into: \"loss\"), Backward(loss: \"loss\", retain_graph: false), OptimizerStep],\n\
      iterations: 2)\n\
saved as fit.ron beside it (`vramscope sweep fit.ron --batch 1,2,4,8`); \
`vramscope model config.json` prints the model alone";

fn options() -> Options {
    Options::default().with_default_extension(Extensions::IMPLICIT_SOME)
}

/// RON's "Expected comma" at the `(` after a word: a step without fields
/// (`OptimizerStep`, `RecreateModel`) written with some. Say so by name.
fn unit_given_fields(text: &str, line: usize, col: usize) -> Option<String> {
    let chars: Vec<char> = text.lines().nth(line.checked_sub(1)?)?.chars().collect();
    let at = col.checked_sub(1)?;
    if chars.get(at) != Some(&'(') {
        return None;
    }
    let start = chars[..at]
        .iter()
        .rposition(|c| !c.is_ascii_alphanumeric() && *c != '_')
        .map_or(0, |i| i + 1);
    let word: String = chars[start..at].iter().collect();
    word.starts_with(|c: char| c.is_ascii_uppercase())
        .then(|| format!("`{word}` takes no fields: write it bare, `{word},`"))
}

pub fn load_str(text: &str, file: &str) -> Result<(Scenario, Built), LoadError> {
    if text.trim_start().starts_with('{') {
        // RON would say "Expected opening `(`": say what the file is instead.
        return Err(LoadError::At {
            file: file.to_string(),
            line: 1,
            column: 1,
            message: JSON_NOT_A_SCENARIO.to_string(),
        });
    }
    let mut scenario: Scenario = options().from_str(text).map_err(|e| LoadError::At {
        file: file.to_string(),
        line: e.position.line,
        column: e.position.col,
        message: match e.code {
            // RON's own advice names its API; a reader needs the reason.
            ron::Error::ExceededRecursionLimit => {
                "nested too deeply (more than 128 levels): not a scenario a person writes"
                    .to_string()
            }
            ron::Error::ExpectedComma => unit_given_fields(text, e.position.line, e.position.col)
                .unwrap_or_else(|| e.code.to_string()),
            code => code.to_string(),
        },
    })?;
    if let ModelSpec::HfConfig(path) = &mut scenario.model {
        // A relative config.json is looked for beside the scenario first.
        let beside = Path::new(file).parent().map(|d| d.join(&*path));
        if let Some(p) = beside.filter(|p| Path::new(path.as_str()).is_relative() && p.is_file()) {
            *path = p.display().to_string();
        }
    }
    let (general, steps) = validate(&scenario);
    if let Some(message) = general.into_iter().next() {
        // `model.heads must…`, `device.capacity: must…`: the message starts
        // with the path of its field.
        let fields: Vec<At<'_>> = message
            .split([':', ' '])
            .next()
            .unwrap_or("")
            .split('.')
            .filter(|f| !f.is_empty())
            .map(At::Field)
            .collect();
        return Err(at_path(text, file, &fields, message.clone()));
    }
    if let Some(p) = steps.into_iter().next() {
        return Err(
            at_word(text, file, p.variant, p.occurrence, p.message.clone()).unwrap_or(
                LoadError::Field {
                    file: file.to_string(),
                    message: p.message,
                },
            ),
        );
    }
    let version = match &scenario.torch {
        Some(v) => v
            .parse::<TorchVersion>()
            .map_err(|m| at_path(text, file, &[At::Field("torch")], m))?,
        None => TorchVersion::DEFAULT,
    };
    let transformers = match &scenario.transformers {
        Some(v) => Some(
            v.parse::<TransformersVersion>()
                .map_err(|m| at_path(text, file, &[At::Field("transformers")], m))?,
        ),
        None => None,
    };
    AllocConfig::parse_for(&scenario.alloc_conf, version)
        .map_err(|e| at_path(text, file, &[At::Field("alloc_conf")], e.to_string()))?;
    let at_problem = |(word, message): (String, String)| field_error(text, file, &word, message);
    let mut conditions = conditions(&scenario, version).map_err(at_problem)?;
    conditions.as_shipped =
        super::library::builtin(&scenario.name).is_some_and(|b| b.source == text);
    let mut engine = scenario.engine.clone().unwrap_or_default();
    apply(&conditions, version, &mut engine).map_err(at_problem)?;
    let mut built = build(&scenario, conditions, engine).map_err(|e| {
        let path = model_path(&e);
        // A field left to its default (`head_dim: None`) is not in the
        // text: then the module that has it.
        let module = || [&path[..path.len().saturating_sub(1)], &[At::Value]].concat();
        match position(text, &path) {
            Some(_) => at_path(text, file, &path, e.to_string()),
            None => at_path(text, file, &module(), e.to_string()),
        }
    })?;
    if scenario.sweep.as_ref().is_some_and(|w| !w.seq.is_empty()) && !super::build::has_seq(&built)
    {
        return Err(at_path(
            text,
            file,
            &[At::Field("sweep"), At::Field("seq")],
            "sweep.seq: this model has no sequence length; sweep.seq applies to GPT, LSTM and token-input Modules models".into(),
        ));
    }
    built.engine.torch_minor = Some(version.0);
    built.engine.transformers = transformers;
    built.steps = Arc::new(StepSites::for_loop(
        file,
        text,
        &built.program.setup,
        &built.program.steps,
        LoopShape {
            targetless: built.model.loss == LossKind::Sum,
            recurrent: matches!(built.model.kind, ModelKind::LstmLm { .. }),
        },
    ));
    Ok((scenario, built))
}

/// The error at the value `path` leads to, as the file's line and column
/// (from the structure of the text, never a search for a word); without a
/// position when the path leads nowhere.
fn at_path(text: &str, file: &str, path: &[At<'_>], message: String) -> LoadError {
    match position(text, path) {
        Some(p) => LoadError::At {
            file: file.to_string(),
            line: p.line,
            column: p.column,
            message,
        },
        None => LoadError::Field {
            file: file.to_string(),
            message,
        },
    }
}

/// A build error's path; a model in the language's error points at the
/// module's field (`model.net…kv_heads`).
fn model_path(e: &BuildError) -> Vec<At<'static>> {
    let mut path: Vec<At<'static>> = e
        .path()
        .iter()
        .map(|s| match s {
            Seg::Field(f) => At::Field(f),
            Seg::Index(i) => At::Index(*i),
        })
        .collect();
    // A module at fault as a whole: its value (`Checkpoint(…)`), not the
    // name of the field that holds it.
    if matches!(e, BuildError::Model(m) if m.field.is_none()) {
        path.push(At::Value);
    }
    path
}

fn field_error(text: &str, file: &str, word: &str, message: String) -> LoadError {
    at_word(text, file, word, 0, message.clone()).unwrap_or(LoadError::Field {
        file: file.to_string(),
        message,
    })
}

/// Position of the `occurrence`-th whole-word `word` outside comments and strings'
/// surroundings, as 1-based line and column.
fn at_word(
    text: &str,
    file: &str,
    word: &str,
    occurrence: usize,
    message: String,
) -> Option<LoadError> {
    if word.is_empty() {
        return None;
    }
    let is_ident = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    let mut seen = 0;
    for (line_no, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut from = 0;
        while let Some(i) = code[from..].find(word) {
            let start = from + i;
            let end = start + word.len();
            let before = code[..start].chars().next_back();
            let after = code[end..].chars().next();
            if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
                if seen == occurrence {
                    let column = code[..start].chars().count() + 1;
                    return Some(LoadError::At {
                        file: file.to_string(),
                        line: line_no + 1,
                        column,
                        message,
                    });
                }
                seen += 1;
            }
            from = end;
        }
    }
    None
}

/// [`resolve`], then the run's `PYTORCH_CUDA_ALLOC_CONF` replaced by `conf`,
/// read as the scenario's own PyTorch release reads it. The scenario's
/// narration and expectations are dropped: they were written for its own
/// config and may be untrue under another.
pub fn resolve_under(name_or_path: &str, conf: &str) -> Result<(Scenario, Built), LoadError> {
    let (mut scenario, mut built) = resolve(name_or_path)?;
    scenario.narration.clear();
    scenario.expect.clear();
    let version = built
        .engine
        .torch_minor
        .map_or(TorchVersion::DEFAULT, TorchVersion);
    AllocConfig::parse_for(conf, version).map_err(|e| LoadError::Conf(Box::new(e)))?;
    built.engine.alloc_conf = conf.to_string();
    Ok((scenario, built))
}

/// How a config is named beside a run's title: the empty string is PyTorch's default.
pub fn conf_label(conf: &str) -> &str {
    if conf.is_empty() {
        "default"
    } else {
        conf
    }
}
