//! cuDNN's choices measured on a GPU (engine.md §1.6): convolution and RNN
//! workspaces, RNN reserves and the dropout state, whose sizes cuDNN's
//! closed heuristics pick per GPU, release and shape. A scenario carries
//! the sizes its capture measured in its own `engine` block; a traced
//! program (`vramscope trace`) finds them here, by shape, when it runs on
//! the GPU and release they were measured on (`assets/measured/`), and
//! takes the engine's estimate otherwise. The lookups are the engine's own
//! ([`conv_workspaces`], [`rnn_buffers`]), so a scenario and a trace size
//! the same call alike.

use std::sync::OnceLock;

use serde::Deserialize;

use super::config::EngineConfig;
use super::conv_workspace::{conv_workspaces, ConvWorkspace, ConvWorkspaces};
use super::dtype::DType;
use crate::alloc::TorchVersion;

/// The measured tables carried in the binary, one per (GPU, release).
const TABLES: [&str; 1] = [include_str!(
    "../../assets/measured/cudnn-H100-SXM-80GB-2.11.ron"
)];

/// cuDNN's RNN cell (`cudnnRNNMode_t`; `torch.backends.cudnn.rnn`'s numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RnnMode {
    RnnRelu,
    RnnTanh,
    Lstm,
    Gru,
}

impl RnnMode {
    /// From cuDNN's number (0 relu, 1 tanh, 2 LSTM, 3 GRU).
    pub fn from_cudnn(n: u64) -> Option<RnnMode> {
        [
            RnnMode::RnnRelu,
            RnnMode::RnnTanh,
            RnnMode::Lstm,
            RnnMode::Gru,
        ]
        .get(usize::try_from(n).ok()?)
        .copied()
    }

    /// Gates per cell: what cuDNN's reserve holds per step and layer.
    fn gates(self) -> u64 {
        match self {
            RnnMode::RnnRelu | RnnMode::RnnTanh => 1,
            RnnMode::Lstm => 4,
            RnnMode::Gru => 3,
        }
    }
}

/// One `_cudnn_rnn` call's shape: x [seq, batch, input] (unpacked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RnnShape {
    pub mode: RnnMode,
    pub input: u64,
    pub hidden: u64,
    pub layers: u64,
    pub seq: u64,
    pub batch: u64,
    pub bidirectional: bool,
    pub dtype: DType,
    pub train: bool,
}

fn f32_dtype() -> DType {
    DType::F32
}

/// One RNN shape's measured buffers (the shape's fields, then the sizes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RnnMeasured {
    mode: RnnMode,
    input: u64,
    hidden: u64,
    layers: u64,
    seq: u64,
    batch: u64,
    #[serde(default)]
    bidirectional: bool,
    #[serde(default = "f32_dtype")]
    dtype: DType,
    train: bool,
    workspace: u64,
    reserve: u64,
}

impl RnnMeasured {
    fn shape(&self) -> RnnShape {
        RnnShape {
            mode: self.mode,
            input: self.input,
            hidden: self.hidden,
            layers: self.layers,
            seq: self.seq,
            batch: self.batch,
            bidirectional: self.bidirectional,
            dtype: self.dtype,
            train: self.train,
        }
    }
}

/// One GPU's and release's measurements.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    /// The GPU profile (`--gpu` / `device.gpu` name).
    pub gpu: String,
    /// The PyTorch release (`2.11`).
    pub torch: String,
    /// The cuDNN release that chose them.
    pub cudnn: String,
    pub dropout_state: Option<u64>,
    pub conv_workspaces: Vec<ConvWorkspace>,
    rnn: Vec<RnnMeasured>,
}

/// A cuDNN RNN call's buffers, and whether they were measured (else the
/// engine's estimates: `rnn_workspace_bytes`, the reserve formula).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RnnBuffers {
    pub workspace: u64,
    /// 0 in inference.
    pub reserve: u64,
    pub measured: bool,
}

fn tables() -> &'static [Measured] {
    static PARSED: OnceLock<Vec<Measured>> = OnceLock::new();
    PARSED.get_or_init(|| {
        TABLES
            .iter()
            .filter_map(|text| ron::from_str::<Measured>(text).ok())
            .collect()
    })
}

/// The measurements for `gpu` (a profile name) under `version`, if any.
pub fn measured_on(gpu: &str, version: TorchVersion) -> Option<&'static Measured> {
    tables()
        .iter()
        .find(|m| m.gpu == gpu && m.torch.parse::<TorchVersion>().ok() == Some(version))
}

/// Every table carried (for the checks that hold them to the scenarios).
pub fn all_measured() -> &'static [Measured] {
    tables()
}

impl Measured {
    /// The measured buffers of an RNN call of this shape, if measured.
    pub fn rnn(&self, shape: &RnnShape) -> Option<(u64, u64)> {
        self.rnn
            .iter()
            .find(|m| m.shape() == *shape)
            .map(|m| (m.workspace, m.reserve))
    }

    /// Every measured RNN shape with its (workspace, reserve).
    pub fn rnn_entries(&self) -> impl Iterator<Item = (RnnShape, u64, u64)> + '_ {
        self.rnn.iter().map(|m| (m.shape(), m.workspace, m.reserve))
    }
}

/// A convolution's workspaces as the engine sizes them (measured where the
/// table has the shape, else min(cap, input bytes)), for x and w of 4
/// dimensions. `conv_workspaces` is the engine's own lookup.
pub(crate) fn conv_buffers(
    table: &[ConvWorkspace],
    cfg: &EngineConfig,
    key: (&[u64; 4], &[u64; 4], u64, u64, DType),
) -> (ConvWorkspaces, bool) {
    let input_bytes = key.0.iter().product::<u64>() * key.4.size();
    let estimate = cfg.conv_workspace_cap.min(input_bytes);
    let measured = table.iter().any(|c| {
        &c.input == key.0
            && &c.weight == key.1
            && c.stride == key.2
            && c.pad == key.3
            && c.dtype == key.4
    });
    (conv_workspaces(table, key, estimate), measured)
}

/// A cuDNN RNN call's workspace and reserve: measured, else the engine's
/// estimates (`rnn_workspace_bytes`, and a reserve of L·T·B·H·k per gate
/// group as `Engine::lstm_cudnn` takes it, engine.md §8.2).
pub fn rnn_buffers(
    measured: Option<&Measured>,
    cfg: &EngineConfig,
    shape: &RnnShape,
) -> RnnBuffers {
    if let Some((workspace, reserve)) = measured.and_then(|m| m.rnn(shape)) {
        return RnnBuffers {
            workspace,
            reserve,
            measured: true,
        };
    }
    let directions = if shape.bidirectional { 2 } else { 1 };
    // k = lstm_reserve_factor for an LSTM's four gates, scaled by gates.
    let per_gate = cfg.lstm_reserve_factor as f64 / 4.0;
    let factor = (per_gate * shape.mode.gates() as f64).ceil() as u64;
    let reserve = if shape.train {
        cfg.rnn_reserve_bytes.unwrap_or(
            shape.layers
                * directions
                * shape.seq
                * shape.batch
                * shape.hidden
                * factor
                * shape.dtype.size(),
        )
    } else {
        0
    };
    RnnBuffers {
        workspace: cfg.rnn_workspace_bytes,
        reserve,
        measured: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lstm(train: bool) -> RnnShape {
        RnnShape {
            mode: RnnMode::Lstm,
            input: 200,
            hidden: 200,
            layers: 2,
            seq: 35,
            batch: 20,
            bidirectional: false,
            dtype: DType::F32,
            train,
        }
    }

    #[test]
    fn the_carried_tables_parse() {
        assert_eq!(all_measured().len(), TABLES.len(), "every table parses");
        let h100 = measured_on("H100-SXM-80GB", TorchVersion(11)).expect("the H100 table");
        assert_eq!(h100.cudnn, "9.19");
        assert!(measured_on("H100-SXM-80GB", TorchVersion(10)).is_none());
        assert!(measured_on("A100-SXM-80GB", TorchVersion(11)).is_none());
    }

    #[test]
    fn a_measured_rnn_shape_takes_its_sizes_and_another_the_estimate() {
        let h100 = measured_on("H100-SXM-80GB", TorchVersion(11));
        let cfg = EngineConfig::default();
        let got = rnn_buffers(h100, &cfg, &lstm(true));
        assert!(got.measured);
        assert_eq!((got.workspace, got.reserve), (23_577_632, 6_177_760));
        let eval = rnn_buffers(h100, &cfg, &lstm(false));
        assert_eq!((eval.workspace, eval.reserve), (23_017_632, 0));
        let other = RnnShape {
            batch: 21,
            ..lstm(true)
        };
        let est = rnn_buffers(h100, &cfg, &other);
        assert!(!est.measured);
        assert_eq!(est.workspace, cfg.rnn_workspace_bytes);
        // The engine's own reserve formula: L·T·B·H·k·elem.
        assert_eq!(est.reserve, 2 * 35 * 21 * 200 * cfg.lstm_reserve_factor * 4);
    }

    #[test]
    fn a_convolution_is_measured_only_at_its_own_shape() {
        let h100 = measured_on("H100-SXM-80GB", TorchVersion(11)).expect("H100");
        let cfg = EngineConfig::default();
        let key = (&[32, 3, 224, 224], &[64, 3, 7, 7], 2, 3, DType::F32);
        let (ws, measured) = conv_buffers(&h100.conv_workspaces, &cfg, key);
        assert!(measured);
        assert_eq!(ws.forward, 122_065_680);
        let key = (&[7, 3, 224, 224], &[64, 3, 7, 7], 2, 3, DType::F32);
        let (ws, measured) = conv_buffers(&h100.conv_workspaces, &cfg, key);
        assert!(!measured);
        assert_eq!(
            ws.forward,
            (7 * 3 * 224 * 224 * 4u64).min(cfg.conv_workspace_cap)
        );
    }
}
