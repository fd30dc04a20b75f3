//! The built-in lessons: every answer holds on its scenarios' runs, the
//! sizes they state are read from the runs, they fit a workshop, no choice
//! gives its answer away by its length or its letter, and the course's
//! exercises run as the course writes them.

use super::*;

#[test]
fn every_built_in_lesson_is_true_to_its_runs() {
    assert!(builtin_lessons().len() >= 4);
    for b in builtin_lessons() {
        let loaded = resolve_lesson(b.name).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let verdicts = verify(&loaded).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        for (i, (part, v)) in loaded.lesson.parts.iter().zip(&verdicts).enumerate() {
            assert!(
                !part.check.is_empty() || !part.compare.is_empty() || !part.figures.is_empty(),
                "{} part {i}: an answer nothing checks",
                b.name
            );
            for c in &v.checks {
                assert!(
                    c.passed,
                    "{} part {} ({}): the answer says {}, the run shows {}",
                    b.name,
                    i + 1,
                    part.scenario,
                    c.expectation,
                    c.observed
                );
            }
            for c in &v.prose {
                assert!(
                    c.passed,
                    "{} part {} ({}): {}, but {}",
                    b.name,
                    i + 1,
                    part.scenario,
                    c.expectation,
                    c.observed
                );
            }
        }
        for c in verify_framing(&loaded, &verdicts) {
            assert!(c.passed, "{}: {} — {}", b.name, c.expectation, c.observed);
        }
    }
}
/// What the text of the built-in lessons and their narration state is
/// checked at all: each lesson states dozens of sizes, and each part with
/// a scenario narration of sizes has them read at the narration's moment.
#[test]
fn the_sizes_the_built_in_lessons_state_are_read() {
    for b in builtin_lessons() {
        let loaded = resolve_lesson(b.name).expect("loads");
        let verdicts = verify(&loaded).expect("runs");
        let read: usize = verdicts.iter().map(|v| v.prose.len()).sum();
        let narrated = verdicts
            .iter()
            .flat_map(|v| &v.prose)
            .filter(|c| c.expectation.contains("(the narration"))
            .count();
        assert!(read >= 30, "{}: {read} sizes read", b.name);
        assert!(narrated >= 10, "{}: {narrated} narrated sizes read", b.name);
    }
}
#[test]
fn built_in_lessons_are_workshop_sized() {
    for b in builtin_lessons() {
        let l = resolve_lesson(b.name).expect("loads").lesson;
        assert_eq!(l.name, b.name, "the name `lesson` takes is the file's");
        assert!(l.minutes.is_some_and(|m| m >= 20), "{}", b.name);
        assert!(l.parts.len() >= 6, "{}: {} parts", b.name, l.parts.len());
        // About four minutes a question: the question, the answers, the
        // explanation and the run.
        let minutes = l.minutes.unwrap_or(0) as usize;
        assert!(
            l.parts.len() * 4 <= minutes + 3,
            "{}: {} questions for {minutes} minutes",
            b.name,
            l.parts.len()
        );
    }
}
/// A room that cannot know the answer must not find it by length: the
/// right choice is never the longest nor clearly the shortest, a part's
/// choices are of comparable length, a question offers at least three
/// (with two, "never the longest" would make the shorter one right), and
/// no rule "take the k-th longest" finds more than half of a lesson's
/// answers.
#[test]
fn no_choice_gives_the_answer_away_by_its_length() {
    let chars = |s: &String| s.chars().count();
    for l in every_lesson() {
        let mut by_rank = [0usize; 4];
        let mut shortest = 0;
        for (i, p) in l.parts.iter().enumerate() {
            let at = format!("{} part {}", l.name, i + 1);
            assert!(p.choices.len() >= 3, "{at}: {} choices", p.choices.len());
            let right = chars(&p.choices[right_choice(p)]);
            let wrong: Vec<usize> = p
                .choices
                .iter()
                .enumerate()
                .filter(|(k, _)| *k != right_choice(p))
                .map(|(_, c)| chars(c))
                .collect();
            let (lo, hi) = (
                wrong.iter().copied().min().unwrap_or(0),
                wrong.iter().copied().max().unwrap_or(0),
            );
            assert!(
                right < hi,
                "{at}: the right choice ({right} characters) is the longest (the others {wrong:?})"
            );
            assert!(
                right * 5 >= lo * 4,
                "{at}: the right choice ({right} characters) is clearly the shortest (the others {wrong:?})"
            );
            let all_lo = lo.min(right);
            assert!(
                hi * 5 <= all_lo * 8,
                "{at}: choices of {all_lo} to {hi} characters are not comparable"
            );
            let rank = wrong.iter().filter(|w| **w > right).count();
            by_rank[rank] += 1;
            if right <= lo {
                shortest += 1;
            }
        }
        let n = l.parts.len();
        for (rank, count) in by_rank.iter().enumerate() {
            assert!(
                *count * 2 <= n || n < 4,
                "{}: taking the choice with {rank} longer ones finds {count} of {n} answers",
                l.name
            );
        }
        assert!(
            shortest * 2 <= n || n < 4,
            "{}: taking the shortest choice finds {shortest} of {n} answers",
            l.name
        );
    }
}
/// No letter is a safe guess: under the lesson's own order and under any
/// other seed, no letter is right in more than a third of the questions
/// (rounded up: every question offers three choices or more), and every
/// letter that most questions offer is right at least once.
#[test]
fn no_letter_is_the_safe_guess() {
    for l in every_lesson().into_iter().filter(|l| l.parts.len() >= 4) {
        let n = l.parts.len();
        let seeds = std::iter::once(default_seed(&l.name)).chain(0..100);
        for seed in seeds {
            let shown = shuffled(&l, seed);
            let mut counts = [0usize; 4];
            let mut offered = [0usize; 4];
            for p in &shown.parts {
                counts[right_choice(p)] += 1;
                for o in offered.iter_mut().take(p.choices.len()) {
                    *o += 1;
                }
            }
            for (k, letter) in LETTERS.iter().enumerate() {
                assert!(
                    counts[k] <= n.div_ceil(3),
                    "{} seed {seed}: {letter} is right in {} of {n} questions",
                    l.name,
                    counts[k]
                );
                if offered[k] * 2 > n {
                    assert!(
                        counts[k] > 0,
                        "{} seed {seed}: {letter} is never right",
                        l.name
                    );
                }
            }
        }
    }
}
/// The figures the allocator lesson quotes, derived from the allocator's
/// rules rather than read off the run: 100 fp32 1000×1000 tensors take
/// 4,000,000 B blocks, five to a 20 MiB segment (20 segments); the 100 MB
/// tensor (1e8 B) gets its own segment rounded up to 2 MiB (96 MiB); the
/// model's small blocks take one 2 MiB segment.
#[test]
fn the_fragmentation_experiment_reserves_what_the_lesson_says() {
    let loaded = resolve_lesson("caching-allocator").expect("loads");
    let verdicts = verify(&loaded).expect("runs");
    let first = &verdicts[0].run;
    let big = 100_000_000u64.div_ceil(2 * MIB) * 2 * MIB;
    assert_eq!(big, 96 * MIB);
    assert_eq!(first.peak_reserved, 20 * 20 * MIB + big + 2 * MIB);
    // The fifth block of each segment keeps the segment's remainder
    // (20 MiB − 4 × 4,000,256 B, under 1 MiB more than it asked): the
    // hundred tensors fill the 20 segments, and the model's blocks add
    // less than 1 MiB.
    assert!((400 * MIB..401 * MIB).contains(&first.peak_allocated));
}
/// The course's deep-MLP exercise as its text writes it (one batch of
/// torch.randn(64, 4096), `model(x).sum().backward()`, no optimizer), with
/// and without checkpointing every layer: the peak is the weights and their
/// gradients, 2 × 335,626,240 fp32 parameters, plus a few MiB, and the two
/// runs differ by the one 1 MiB layer output checkpointing rebuilds. At
/// 8,192 rows the same model's activations are what checkpointing saves.
#[test]
fn the_course_exercise_runs_as_the_course_writes_it() {
    use vramscope::engine::Step;
    use vramscope::scenario::{run, RunOptions};
    let loaded = resolve_lesson("efficient-training").expect("loads");
    let weights = 20 * (4096 * 4096 + 4096) * 4u64;
    let mut peaks = Vec::new();
    for file in [
        "scenarios/course-deep-mlp.ron",
        "scenarios/course-deep-mlp-checkpoint.ron",
    ] {
        assert!(
            loaded.lesson.parts.iter().any(|p| p.scenario == file
                || p.says.iter().any(|s| format!("{:?}", s.1).contains(file))),
            "the lesson runs {file}"
        );
        let (scenario, built) = loaded.scenario(file).expect("a lesson scenario");
        assert_eq!(
            scenario.data.batch,
            Some(64),
            "{file}: torch.randn(64, 4096)"
        );
        assert!(scenario.optimizer.is_none(), "{file}: no optimizer");
        assert_eq!(scenario.iterations, 1, "{file}: one pass");
        assert!(
            !scenario
                .steps
                .iter()
                .any(|s| matches!(s, Step::OptimizerStep | Step::ZeroGrad { .. })),
            "{file}"
        );
        let r = run(&scenario, &built, &RunOptions::default());
        assert!(r.oom.is_none() && r.error.is_none(), "{file}");
        assert!(
            (2 * weights..2 * weights + 32 * MIB).contains(&r.peak_allocated),
            "{file}: peak {} against weights {weights}",
            r.peak_allocated
        );
        peaks.push(r.peak_allocated);
    }
    assert!(
        peaks[1] >= peaks[0] && peaks[1] - peaks[0] <= MIB,
        "{peaks:?}"
    );
    // At 8,192 rows the activations dwarf the 1 MiB: the same model peaks
    // more than a GiB above its weights and gradients.
    let (scenario, built) = loaded.scenario("deep-mlp-no-checkpoint").expect("built-in");
    let big = run(&scenario, &built, &RunOptions::default());
    assert!(
        big.peak_allocated > 2 * weights + 1024 * MIB,
        "{}",
        big.peak_allocated
    );
}
