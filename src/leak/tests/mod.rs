//! Leak-detector tests. Expected bytes come from engine.md's formulas (§9.1,
//! §10) and the model shapes, never from the detector's own output.

mod growth;
mod snapshot;
mod truth;
