//! `PYTORCH_CUDA_ALLOC_CONF` parsing with PyTorch's grammar and messages (allocator.md §10).

use super::constants::{LARGE_BUFFER, MIB, ROUNDUP_INTERVALS};
use super::version::TorchVersion;

/// Which allocator backend the config names. Only `native` is modelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Native,
    CudaMallocAsync,
}

/// The parsed allocator configuration. `Default` is PyTorch with the variable unset.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocConfig {
    /// The raw string, as snapshots report it in `allocator_settings`.
    pub raw: String,
    pub version: TorchVersion,
    /// `u64::MAX` when unlimited (`memory_stats()["max_split_size"]` shows -1 then).
    pub max_split_size: u64,
    pub max_non_split_rounding_size: u64,
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    pub backend: Backend,
    /// Accepted and ignored: the simulation is single-threaded.
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_use_background_threads: bool,
    pub graph_capture_record_stream_reuse: bool,
    /// 2.10+ config key; `None` when not given.
    pub per_process_memory_fraction: Option<f64>,
    /// 2.12+ `large_segment_size_mb`; 20 MiB before.
    pub large_segment_size: u64,
    pub throw_on_cudamalloc_oom: bool,
}

impl AllocConfig {
    /// The same rules, however the strings that set them were written
    /// (`expandable_segments:True` and `expandable_segments:true,` alike).
    pub fn same_rules(&self, other: &AllocConfig) -> bool {
        let unwritten = |c: &AllocConfig| AllocConfig {
            raw: String::new(),
            ..c.clone()
        };
        unwritten(self) == unwritten(other)
    }

    /// The same block sizes and splits for the same requests: the two rules
    /// a recorded trace's map is rebuilt with (`round_size`, `should_split`)
    /// read the same settings.
    pub fn same_block_rules(&self, other: &AllocConfig) -> bool {
        self.max_split_size == other.max_split_size
            && self.roundup_power2_divisions == other.roundup_power2_divisions
    }
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig {
            raw: String::new(),
            version: TorchVersion::DEFAULT,
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            backend: Backend::Native,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            graph_capture_record_stream_reuse: false,
            per_process_memory_fraction: None,
            large_segment_size: LARGE_BUFFER,
            throw_on_cudamalloc_oom: false,
        }
    }
}

/// A rejected config: PyTorch's message, and the key and value it was about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PYTORCH_CUDA_ALLOC_CONF \"{conf}\": {message} (key `{key}`, value `{value}`)")]
pub struct ConfigError {
    pub conf: String,
    pub key: String,
    pub value: String,
    /// PyTorch's own wording for the same input.
    pub message: String,
}

impl AllocConfig {
    /// Parse with the default era's rules.
    pub fn parse(conf: &str) -> Result<AllocConfig, ConfigError> {
        Self::parse_for(conf, TorchVersion::DEFAULT)
    }

    /// Parse as the given PyTorch release would.
    pub fn parse_for(conf: &str, version: TorchVersion) -> Result<AllocConfig, ConfigError> {
        let mut config = AllocConfig {
            raw: conf.to_string(),
            version,
            ..AllocConfig::default()
        };
        Parser::new(conf, version).run(&mut config)?;
        Ok(config)
    }

    pub fn max_split_limited(&self) -> bool {
        self.max_split_size != u64::MAX
    }

    /// `memory_stats()["max_split_size"]`: -1 when unlimited.
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_limited() {
            self.max_split_size as i64
        } else {
            -1
        }
    }
}

/// §10.2: `,` `:` `[` `]` are tokens of their own; spaces are dropped
/// (2.10+ drops every whitespace character).
fn tokenize(conf: &str, version: TorchVersion) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buf = String::new();
    for ch in conf.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                tokens.push(std::mem::take(&mut buf));
            }
            tokens.push(ch.to_string());
        } else if ch == ' ' || (!version.classic_parser() && ch.is_whitespace()) {
            continue;
        } else {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        tokens.push(buf);
    }
    tokens
}

/// C `stoll`: optional whitespace and sign, then at least one digit; the rest is ignored.
fn c_stoll(token: &str) -> Option<i64> {
    let t = token.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    if end == 0 {
        return None;
    }
    let magnitude: i64 = digits[..end].parse().ok()?;
    Some(if neg { -magnitude } else { magnitude })
}

/// C `stod`: the longest leading prefix that reads as a floating-point number.
fn c_stod(token: &str) -> Option<f64> {
    let t = token.trim_start();
    (1..=t.len())
        .rev()
        .filter(|&end| t.is_char_boundary(end))
        .find_map(|end| {
            t[..end]
                .parse::<f64>()
                .ok()
                .filter(|_| !t[..end].ends_with(['e', 'E']))
        })
}

struct Parser {
    conf: String,
    tokens: Vec<String>,
    version: TorchVersion,
    i: usize,
}

impl Parser {
    fn new(conf: &str, version: TorchVersion) -> Parser {
        Parser {
            conf: conf.to_string(),
            tokens: tokenize(conf, version),
            version,
            i: 0,
        }
    }

    fn err(&self, key: &str, value: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            conf: self.conf.clone(),
            key: key.to_string(),
            value: value.to_string(),
            message: message.into(),
        }
    }

    fn token(&self, i: usize) -> Option<&str> {
        self.tokens.get(i).map(String::as_str)
    }

    /// 2.4–2.9 check separators ("expected c"); 2.10+ checks but ignores the result.
    fn consume(&self, i: usize, c: char, key: &str) -> Result<(), ConfigError> {
        let ok = self
            .token(i)
            .is_some_and(|t| t.len() == 1 && t.starts_with(c));
        if ok || !self.version.classic_parser() {
            Ok(())
        } else {
            let got = self.token(i).unwrap_or("");
            Err(self.err(
                key,
                got,
                format!("Error parsing CachingAllocator settings, expected {c}"),
            ))
        }
    }

    /// `key` `:` `value`: leaves `self.i` on the value and returns it.
    fn value(&mut self, key: &str) -> Result<String, ConfigError> {
        self.i += 1;
        self.consume(self.i, ':', key)?;
        self.i += 1;
        match self.token(self.i) {
            Some(v) => Ok(v.to_string()),
            None => Err(self.err(key, "", format!("Error, expecting {key} value"))),
        }
    }

    fn run(mut self, config: &mut AllocConfig) -> Result<(), ConfigError> {
        let mut used_async = false;
        let mut used_native_only = false;
        while self.i < self.tokens.len() {
            let key = self.tokens[self.i].clone();
            match key.as_str() {
                "max_split_size_mb" => {
                    config.max_split_size = self.size_mb(&key, config)?;
                    used_native_only = true;
                }
                "max_non_split_rounding_mb" if self.version.has_max_non_split_rounding() => {
                    config.max_non_split_rounding_size = self.size_mb(&key, config)?;
                    used_native_only = true;
                }
                "large_segment_size_mb" if self.version.has_large_segment_size() => {
                    let v = self.value(&key)?;
                    let mb = self.integer(&key, &v)?;
                    if mb <= 10 {
                        return Err(self.err(
                            &key,
                            &v,
                            "CachingAllocator option large_segment_size_mb must be > 10 MB",
                        ));
                    }
                    config.large_segment_size = (mb as u64).saturating_mul(MIB);
                    config.max_non_split_rounding_size = config.large_segment_size;
                }
                "garbage_collection_threshold" => {
                    config.garbage_collection_threshold = self.gc_threshold(&key)?;
                    used_native_only = true;
                }
                "roundup_power2_divisions" => {
                    self.roundup(&key, &mut config.roundup_power2_divisions)?;
                    used_native_only = true;
                }
                "backend" => {
                    let v = self.value(&key)?;
                    config.backend =
                        match v.as_str() {
                            "native" => Backend::Native,
                            "cudaMallocAsync" => {
                                used_async = true;
                                Backend::CudaMallocAsync
                            }
                            _ => return Err(self.err(
                                &key,
                                &v,
                                "Unknown allocator backend, options are native and cudaMallocAsync",
                            )),
                        };
                }
                "expandable_segments" => {
                    config.expandable_segments = self.boolean(&key)?;
                    used_native_only = true;
                }
                "release_lock_on_cudamalloc" | "release_lock_on_hipmalloc" => {
                    config.release_lock_on_cudamalloc =
                        self.boolean("release_lock_on_cudamalloc")?;
                    used_native_only = true;
                }
                "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                    config.pinned_use_cuda_host_register =
                        self.boolean("pinned_use_cuda_host_register")?;
                }
                "pinned_num_register_threads" => {
                    let v = self.value(&key)?;
                    let n = self.integer(&key, &v)?;
                    if !(n > 0 && (n as u64).is_power_of_two() && n <= 128) {
                        return Err(self.err(
                            &key,
                            &v,
                            "Number of register threads has to be power of 2 and less than or equal to 128",
                        ));
                    }
                    config.pinned_num_register_threads = n as u64;
                }
                "pinned_use_background_threads" if self.version.has_max_non_split_rounding() => {
                    config.pinned_use_background_threads = self.boolean(&key)?;
                }
                "graph_capture_record_stream_reuse" if self.version.0 >= 9 => {
                    config.graph_capture_record_stream_reuse = self.boolean(&key)?;
                }
                "pinned_reserve_segment_size_mb"
                | "pinned_max_round_threshold_mb"
                | "pinned_max_cached_size_mb"
                    if self.version.0 >= 9 =>
                {
                    let v = self.value(&key)?;
                    self.integer(&key, &v)?;
                }
                "pinned_free_catch_all" if self.version.0 >= 12 => {
                    self.boolean(&key)?;
                }
                "per_process_memory_fraction" if !self.version.classic_parser() => {
                    let v = self.value(&key)?;
                    let f = c_stod(&v).ok_or_else(|| {
                        self.err(
                            &key,
                            &v,
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        )
                    })?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(self.err(
                            &key,
                            &v,
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]",
                        ));
                    }
                    config.per_process_memory_fraction = Some(f);
                }
                "throw_on_cudamalloc_oom" if self.version.has_large_segment_size() => {
                    config.throw_on_cudamalloc_oom = self.boolean(&key)?;
                }
                _ => {
                    let message = if self.version.classic_parser() {
                        format!("Unrecognized CachingAllocator option: {key}")
                    } else {
                        format!("Unrecognized key '{key}' in CUDA allocator config.")
                    };
                    return Err(self.err(&key, "", message));
                }
            }
            if self.i + 1 < self.tokens.len() {
                self.i += 1;
                self.consume(self.i, ',', &key)?;
            }
            self.i += 1;
        }
        // PyTorch only warns here; the config stays valid.
        let _ = used_async && used_native_only;
        Ok(())
    }

    fn integer(&self, key: &str, v: &str) -> Result<i64, ConfigError> {
        c_stoll(v).ok_or_else(|| {
            self.err(
                key,
                v,
                format!("expected an integer value for {key}, got '{v}' (stoi: no conversion)"),
            )
        })
    }

    fn boolean(&mut self, key: &str) -> Result<bool, ConfigError> {
        let v = self.value(key)?;
        match v.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ if self.version.classic_parser() => Err(self.err(
                key,
                &v,
                format!("Expected a single True/False argument for {key}"),
            )),
            _ => Err(self.err(
                key,
                &v,
                format!(
                    "Expected 'True' or 'False' at index {} in ConfigTokenizer but got '{v}'",
                    self.i
                ),
            )),
        }
    }

    /// `max_split_size_mb` / `max_non_split_rounding_mb`: MiB, with the era's minimum.
    fn size_mb(&mut self, key: &str, config: &AllocConfig) -> Result<u64, ConfigError> {
        let v = self.value(key)?;
        // C++ reads the value into size_t: a negative number wraps around.
        let mb = self.integer(key, &v)? as u64;
        let min_mb = config.large_segment_size / MIB;
        if self.version.classic_parser() {
            if mb <= min_mb {
                return Err(self.err(
                    key,
                    &v,
                    format!("CachingAllocator option {key} too small, must be > {min_mb}"),
                ));
            }
        } else if mb < min_mb {
            return Err(self.err(
                key,
                &v,
                format!("CachingAllocator option {key} too small, must be >= {min_mb}"),
            ));
        }
        Ok(mb.min(u64::MAX / MIB) * MIB)
    }

    fn gc_threshold(&mut self, key: &str) -> Result<f64, ConfigError> {
        let v = self.value(key)?;
        let classic = self.version.classic_parser();
        let invalid = |p: &Parser, which: &str| {
            if classic {
                p.err(
                    key,
                    &v,
                    format!("garbage_collect_threshold too {which}, set it 0.0~1.0"),
                )
            } else {
                p.err(
                    key,
                    &v,
                    "garbage_collect_threshold is invalid, set it in (0.0, 1.0)",
                )
            }
        };
        let t = c_stod(&v).ok_or_else(|| invalid(self, "small"))?;
        if t <= 0.0 {
            return Err(invalid(self, "small"));
        }
        if t >= 1.0 {
            return Err(invalid(self, "big"));
        }
        Ok(t)
    }

    fn roundup(
        &mut self,
        key: &str,
        div: &mut [u64; ROUNDUP_INTERVALS],
    ) -> Result<(), ConfigError> {
        let spelled = if self.version.misspells_divisions() {
            "divisons"
        } else {
            "divisions"
        };
        let first = self.value(key)?;
        if first != "[" {
            let n = self.integer(key, &first)?;
            if !(n > 0 && (n as u64).is_power_of_two()) {
                return Err(self.err(
                    key,
                    &first,
                    format!("For roundups, the {spelled} has to be power of 2 "),
                ));
            }
            div.fill(n as u64);
            return Ok(());
        }
        let mut first_value = true;
        let mut last_index = 0usize;
        loop {
            self.i += 1;
            let Some(interval) = self.token(self.i).map(str::to_string) else {
                return Err(self.err(key, "[", "Error parsing roundup_power2_divisions value"));
            };
            if interval == "]" {
                return Ok(());
            }
            self.i += 1;
            self.consume(self.i, ':', key)?;
            self.i += 1;
            let Some(raw) = self.token(self.i).map(str::to_string) else {
                return Err(self.err(
                    key,
                    &interval,
                    "Error parsing roundup_power2_divisions value",
                ));
            };
            let value = self.integer(key, &raw)?;
            if !(value == 0 || (value > 0 && (value as u64).is_power_of_two())) {
                return Err(self.err(
                    key,
                    &raw,
                    format!(
                        "For roundups, the {spelled} has to be power of 2 or 0 to disable roundup "
                    ),
                ));
            }
            let value = value as u64;
            if interval == ">" {
                // allocator.md §10.4: 2.4–2.9 overwrite the last explicit entry too.
                let from = if self.version.classic_parser() {
                    last_index
                } else {
                    last_index + 1
                };
                for d in div.iter_mut().skip(from) {
                    *d = value;
                }
            } else {
                let mb = self.integer(key, &interval)?;
                if !(mb > 0 && (mb as u64).is_power_of_two()) {
                    return Err(self.err(
                        key,
                        &interval,
                        "For roundups, the intervals have to be power of 2 ",
                    ));
                }
                let index =
                    ((63 - (mb as u64).leading_zeros()) as usize).min(ROUNDUP_INTERVALS - 1);
                if first_value {
                    div[..index].fill(value);
                    first_value = false;
                }
                div[index] = value;
                last_index = index;
            }
            match self.token(self.i + 1) {
                Some("]") => {}
                Some(_) => {
                    self.i += 1;
                    self.consume(self.i, ',', key)?;
                }
                None => {
                    return Err(self.err(key, &raw, "Error parsing roundup_power2_divisions value"))
                }
            }
        }
    }
}
