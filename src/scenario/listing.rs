//! A scenario's program written out as the PyTorch code it stands for: the
//! setup, then `for it in range(N):` with the loop's steps indented, a
//! `Repeat` as a nested loop, and the steps a `with` block covers indented
//! under it (`model.eval()` + `torch.no_grad()` up to `model.train()`,
//! autocast up to its exit). Each line keeps the number of the step it stands
//! for, so the UI can light the line of the step at its cursor.

use std::sync::Arc;

use super::statement::{statement_in, LoopShape};
use super::steps::StepSites;
use crate::engine::{numbered, preorder_len, GradContext, Program, Step};

/// One line of the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeLine {
    /// Indentation, in blocks.
    pub depth: u16,
    pub text: String,
    /// The step this line stands for; `None` for a loop header of the
    /// iterations.
    pub step: Option<u32>,
    /// A comment (the end of a `with` block has no statement of its own).
    pub comment: bool,
}

/// The whole program as code, and where each step is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub lines: Vec<CodeLine>,
    pub sites: Arc<StepSites>,
}

/// An open `with` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Grad,
    Autocast,
}

struct Writer {
    lines: Vec<CodeLine>,
    open: Vec<Block>,
    /// How the model makes the statements read (see `statement_in`).
    shape: LoopShape,
}

impl Writer {
    fn depth(&self, base: u16) -> u16 {
        base + self.open.len() as u16
    }

    fn push(&mut self, depth: u16, text: String, step: Option<u32>, comment: bool) {
        self.lines.push(CodeLine {
            depth,
            text,
            step,
            comment,
        });
    }

    /// Close the innermost open `kind` block and what was opened inside it.
    fn close(&mut self, kind: Block) -> bool {
        match self.open.iter().rposition(|b| *b == kind) {
            Some(i) => {
                self.open.truncate(i);
                true
            }
            None => false,
        }
    }

    fn steps(&mut self, steps: &[Step], first: u32, base: u16) {
        let outer = self.open.len();
        for (index, s) in numbered(steps, first) {
            self.step(s, index, base);
        }
        // A block left open at the end of a loop's body ends with the body.
        self.open.truncate(outer.min(self.open.len()));
    }

    fn step(&mut self, s: &Step, index: u32, base: u16) {
        let at = Some(index);
        match s {
            Step::Train => {
                self.close(Block::Grad);
                self.push(self.depth(base), statement_in(s, self.shape), at, false);
            }
            Step::Eval { grad } => {
                self.close(Block::Grad);
                self.push(self.depth(base), "model.eval()".into(), at, false);
                if let Some(with) = grad_with(*grad) {
                    self.push(self.depth(base), with, at, false);
                    self.open.push(Block::Grad);
                }
            }
            Step::SetGrad { grad } => {
                let closed = self.close(Block::Grad);
                match grad_with(*grad) {
                    Some(with) => {
                        self.push(self.depth(base), with, at, false);
                        self.open.push(Block::Grad);
                    }
                    None if closed => {
                        let text = "# end of the with block".into();
                        self.push(self.depth(base), text, at, true);
                    }
                    None => self.push(self.depth(base), statement_in(s, self.shape), at, false),
                }
            }
            Step::AutocastEnter { .. } => {
                self.push(self.depth(base), statement_in(s, self.shape), at, false);
                self.open.push(Block::Autocast);
            }
            Step::AutocastExit => {
                self.close(Block::Autocast);
                let text = "# end of the autocast block".into();
                self.push(self.depth(base), text, at, true);
            }
            Step::Repeat { steps, .. } | Step::Every { steps, .. } => {
                self.push(self.depth(base), statement_in(s, self.shape), at, false);
                let depth = self.depth(base) + 1;
                let outer = std::mem::take(&mut self.open);
                self.steps(steps, index + 1, depth);
                self.open = outer;
            }
            _ => self.push(self.depth(base), statement_in(s, self.shape), at, false),
        }
    }
}

/// `with torch.no_grad():` for a context that turns grad off.
fn grad_with(g: GradContext) -> Option<String> {
    match g {
        GradContext::Enabled => None,
        GradContext::NoGrad => Some("with torch.no_grad():".into()),
        GradContext::InferenceMode => Some("with torch.inference_mode():".into()),
    }
}

impl Listing {
    /// The listing of `program`, its steps written where `sites` says.
    pub fn new(program: &Program, sites: Arc<StepSites>) -> Listing {
        let mut w = Writer {
            lines: Vec::new(),
            open: Vec::new(),
            shape: sites.shape,
        };
        for (index, s) in numbered(&program.setup, 0) {
            w.step(s, index, 0);
        }
        let depth = w.depth(0);
        let header = match program.epoch_len {
            // Several epochs: say what `epoch` (an Every's) counts.
            n if n > 0 && n < program.iterations => format!(
                "for it in range({}):  # epoch = it // {n}",
                program.iterations
            ),
            _ => format!("for it in range({}):", program.iterations),
        };
        w.push(depth, header, None, false);
        let blocks = std::mem::take(&mut w.open);
        w.steps(&program.steps, preorder_len(&program.setup), depth + 1);
        w.open = blocks;
        Listing {
            lines: w.lines,
            sites,
        }
    }

    /// Columns the widest line takes with `indent` columns per block.
    pub fn width(&self, indent: usize) -> usize {
        self.lines
            .iter()
            .map(|l| indent * usize::from(l.depth) + l.text.chars().count())
            .max()
            .unwrap_or(0)
    }

    /// The first line standing for step `step`.
    pub fn line_of(&self, step: u32) -> Option<usize> {
        self.lines.iter().position(|l| l.step == Some(step))
    }

    /// `file:line:column` of step `step` in the scenario.
    pub fn location(&self, step: u32) -> Option<String> {
        self.sites.get(step).map(|s| self.sites.location(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(setup: &str, steps: &str) -> Vec<String> {
        let parse = |s: &str| ron::from_str::<Vec<Step>>(s).expect("steps");
        let program = Program {
            setup: parse(setup),
            steps: parse(steps),
            iterations: 3,
            batch_sizes: Vec::new(),
            seq_lens: Vec::new(),
            epoch_len: 0,
        };
        let l = Listing::new(&program, Arc::default());
        l.lines
            .iter()
            .map(|l| {
                let n = l.step.map_or("-".into(), |s| s.to_string());
                format!("{n} {}{}", "    ".repeat(l.depth as usize), l.text)
            })
            .collect()
    }

    #[test]
    fn the_loop_and_its_blocks_are_indented() {
        let got = listing(
            "[]",
            r#"[Train, LoadBatch(x: "x", y: "y"), Backward(loss: "loss", retain_graph: false),
                Eval(grad: NoGrad), Forward(input: "vx", output: "vout")]"#,
        );
        assert_eq!(
            got,
            [
                "- for it in range(3):",
                "0     model.train()",
                "1     x, y = next(batches)",
                "2     loss.backward()",
                "3     model.eval()",
                "3     with torch.no_grad():",
                "4         vout = model(vx)",
            ]
        );
    }

    #[test]
    fn a_setup_block_holds_the_loop_and_repeat_nests() {
        let got = listing(
            "[Eval(grad: InferenceMode)]",
            r#"[Repeat(times: 2, steps: [AutocastEnter(dtype: F16), Forward(input: "x", output: "out"), AutocastExit]),
                OptimizerStep]"#,
        );
        assert_eq!(
            got,
            [
                "0 model.eval()",
                "0 with torch.inference_mode():",
                "-     for it in range(3):",
                "1         for _ in range(2):",
                "2             with torch.autocast(\"cuda\", dtype=torch.float16):",
                "3                 out = model(x)",
                "4             # end of the autocast block",
                "5         optimizer.step()",
            ]
        );
    }

    #[test]
    fn an_autocast_the_setup_leaves_open_wraps_the_loop() {
        let got = listing(
            "[AutocastEnter(dtype: F16)]",
            r#"[Forward(input: "x", output: "out"), OptimizerStep]"#,
        );
        assert_eq!(
            got,
            [
                "0 with torch.autocast(\"cuda\", dtype=torch.float16):",
                "-     for it in range(3):",
                "1         out = model(x)",
                "2         optimizer.step()",
            ]
        );
    }

    #[test]
    fn a_schedule_nests_its_steps_and_their_blocks() {
        let got = listing(
            "[NewDeque(name: \"recent\", maxlen: 5)]",
            r#"[Every(n: 5, offset: 4, unit: Epoch, steps: [Eval(grad: NoGrad), Assign(name: "correct", value: 0),
                   Repeat(times: 2, steps: [CountCorrect(output: "vout", target: "vy", into: "correct", what: Item)]),
                   Train]),
                Append(from: "loss", list: "recent", what: Tensor)]"#,
        );
        assert_eq!(
            got,
            [
                "0 recent = collections.deque(maxlen=5)",
                "- for it in range(3):",
                "1     if epoch % 5 == 4:  # at the epoch's last batch",
                "2         model.eval()",
                "2         with torch.no_grad():",
                "3             correct = 0",
                "4             for _ in range(2):",
                "5                 correct += (vout.argmax(1) == vy).sum().item()",
                "6         model.train()",
                "7     recent.append(loss)",
            ]
        );
    }

    #[test]
    fn epochs_say_what_epoch_counts() {
        let program = Program {
            epoch_len: 10,
            ..Program::training(100)
        };
        let l = Listing::new(&program, Arc::default());
        assert_eq!(l.lines[0].text, "for it in range(100):  # epoch = it // 10");
        let one = Program {
            epoch_len: 100,
            ..Program::training(100)
        };
        assert_eq!(
            Listing::new(&one, Arc::default()).lines[0].text,
            "for it in range(100):"
        );
    }

    #[test]
    fn every_shipped_step_has_a_line() {
        for b in crate::scenario::builtins() {
            let file = format!("scenarios/{}.ron", b.name);
            let (_, built) = crate::scenario::load_str(b.source, &file).expect("ships valid");
            let p = &built.program;
            let l = Listing::new(p, built.steps.clone());
            for step in 0..preorder_len(&p.setup) + preorder_len(&p.steps) {
                assert!(l.line_of(step).is_some(), "{file}: step {step} has no line");
                assert!(
                    l.location(step).is_some(),
                    "{file}: step {step} not located"
                );
            }
        }
    }

    #[test]
    fn a_sum_loss_takes_no_target() {
        // deep-mlp-checkpoint trains with `criterion: Sum`: the batch has
        // no target and the loss is `out.sum()`.
        let b = crate::scenario::builtin("deep-mlp-checkpoint").expect("built in");
        let (_, built) = crate::scenario::load_str(b.source, "d.ron").expect("valid");
        let l = Listing::new(&built.program, built.steps.clone());
        let text: Vec<&str> = l.lines.iter().map(|l| l.text.as_str()).collect();
        assert!(text.contains(&"x = next(batches)"), "{text:?}");
        assert!(text.contains(&"loss = out.sum()"), "{text:?}");
        let loss = built.steps.get(3).map(|s| s.statement.as_str());
        assert_eq!(loss, Some("loss = out.sum()"));
    }

    #[test]
    fn an_lstm_forward_takes_and_returns_the_hidden_state() {
        // The LSTM language model's loop is `out, hidden = model(x, hidden)`:
        // blocks of the hidden state name that line, not `out = model(x)`.
        let b = crate::scenario::builtin("rnn-hidden-bug").expect("built in");
        let (_, built) = crate::scenario::load_str(b.source, "r.ron").expect("valid");
        let l = Listing::new(&built.program, built.steps.clone());
        let text: Vec<&str> = l.lines.iter().map(|l| l.text.as_str()).collect();
        assert!(text.contains(&"out, hidden = model(x, hidden)"), "{text:?}");
        assert!(!text.contains(&"out = model(x)"), "{text:?}");
    }
}
