//! Tests of lower layers that need a whole scenario run: kernel launches of
//! library scenarios, and the leak detector driven by the scenario loop.

mod launches;
mod leak_findings;
