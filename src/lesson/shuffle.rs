//! The order a lesson's choices are shown in: shuffled per part, stable
//! under a seed (a teacher's notes, a handout and its answer key agree as
//! long as the seed does), with the right choice's positions kept balanced
//! across the lesson so that no letter is the safe guess.
//!
//! The seed defaults to one fixed per lesson ([`default_seed`]), so every
//! run of a lesson shows the same order unless `--seed` says otherwise.

use super::format::Lesson;
use super::LETTERS;

/// The seed a lesson shows its choices under when none is given: a hash
/// of its name (FNV-1a, fixed across releases and platforms), kept to four
/// digits so a teacher can write it down.
pub fn default_seed(lesson_name: &str) -> u64 {
    let hash = lesson_name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash % 10_000
}

/// Where each part's right choice is shown: the letters dealt as evenly as
/// the parts' numbers of choices allow (the most constrained parts first,
/// each taking a least-used letter it offers), then swapped between random
/// pairs of parts that both offer both letters, so that the counts stay
/// even while the order is anyone's guess.
fn right_positions(choices: &[usize], rng: &mut fastrand::Rng) -> Vec<usize> {
    let mut by_count: Vec<usize> = (0..choices.len()).collect();
    rng.shuffle(&mut by_count);
    by_count.sort_by_key(|i| choices[*i]);
    let mut used = [0usize; LETTERS.len()];
    let mut at = vec![0usize; choices.len()];
    for i in by_count {
        let n = choices[i].clamp(1, LETTERS.len());
        let least = used[..n].iter().copied().min().unwrap_or(0);
        let open: Vec<usize> = (0..n).filter(|p| used[*p] == least).collect();
        at[i] = open[rng.usize(..open.len())];
        used[at[i]] += 1;
    }
    if at.len() > 1 {
        for _ in 0..at.len() * 20 {
            let (i, j) = (rng.usize(..at.len()), rng.usize(..at.len()));
            if at[i] < choices[j] && at[j] < choices[i] {
                at.swap(i, j);
            }
        }
    }
    at
}

/// For each part, the file's choice index shown at each position:
/// `order[part][shown] = index in the file`.
pub fn choice_order(lesson: &Lesson, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let counts: Vec<usize> = lesson
        .parts
        .iter()
        .map(|p| p.choices.len().min(LETTERS.len()))
        .collect();
    let right_at = right_positions(&counts, &mut rng);
    lesson
        .parts
        .iter()
        .zip(counts.iter().zip(right_at))
        .map(|(part, (&n, at))| {
            let answer = LETTERS
                .iter()
                .position(|l| *l == part.answer)
                .filter(|i| *i < n);
            let Some(answer) = answer else {
                // Not a valid part (load refuses these); shown as written.
                return (0..n).collect();
            };
            let mut others: Vec<usize> = (0..n).filter(|i| *i != answer).collect();
            rng.shuffle(&mut others);
            let mut others = others.into_iter();
            (0..n)
                .map(|shown| {
                    if shown == at {
                        answer
                    } else {
                        others.next().unwrap_or(answer)
                    }
                })
                .collect()
        })
        .collect()
}

/// The lesson as shown under `seed`: each part's choices in their shown
/// order and its answer the letter the right choice is shown at.
pub fn shuffled(lesson: &Lesson, seed: u64) -> Lesson {
    let order = choice_order(lesson, seed);
    let mut out = lesson.clone();
    for (part, order) in out.parts.iter_mut().zip(order) {
        let Some(answer) = LETTERS.iter().position(|l| *l == part.answer) else {
            continue;
        };
        let Some(shown) = order.iter().position(|i| *i == answer) else {
            continue;
        };
        part.choices = order.iter().map(|i| part.choices[*i].clone()).collect();
        part.answer = LETTERS[shown];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lesson::Part;

    fn part(choices: usize, answer: char) -> Part {
        Part {
            scenario: "s".into(),
            setup: vec![],
            question: "q".into(),
            choices: (0..choices).map(|i| format!("choice {i}")).collect(),
            answer,
            explanation: vec!["e".into()],
            check: vec![],
            compare: vec![],
            figures: vec![],
            says: vec![],
        }
    }

    fn lesson(parts: Vec<Part>) -> Lesson {
        Lesson {
            name: "l".into(),
            title: "t".into(),
            description: "d".into(),
            minutes: None,
            intro: vec!["i".into()],
            parts,
            summary: vec![],
        }
    }

    #[test]
    fn the_right_choice_follows_its_text() {
        let l = lesson((0..12).map(|i| part(2 + i % 3, 'b')).collect());
        for seed in 0..50 {
            let s = shuffled(&l, seed);
            for (before, after) in l.parts.iter().zip(&s.parts) {
                let mut sorted = after.choices.clone();
                sorted.sort();
                assert_eq!(sorted, before.choices, "the same choices, reordered");
                let at = LETTERS
                    .iter()
                    .position(|c| *c == after.answer)
                    .expect("a–d");
                assert_eq!(after.choices[at], "choice 1", "seed {seed}");
            }
        }
    }

    #[test]
    fn a_seed_gives_one_order_and_seeds_differ() {
        let l = lesson((0..12).map(|_| part(4, 'a')).collect());
        assert_eq!(shuffled(&l, 7), shuffled(&l, 7));
        let orders: std::collections::HashSet<Vec<Vec<usize>>> =
            (0..20).map(|s| choice_order(&l, s)).collect();
        assert!(orders.len() > 15, "{} distinct orders", orders.len());
        assert_ne!(default_seed("leaks"), default_seed("caching-allocator"));
        assert_eq!(default_seed("leaks"), default_seed("leaks"));
    }

    /// Every answer written as 'a' in the file: shown, the letters are
    /// right equally often (within one), and not in a fixed cycle.
    #[test]
    fn positions_stay_balanced_whatever_the_file_says() {
        let l = lesson((0..16).map(|_| part(4, 'a')).collect());
        for seed in 0..200 {
            let mut counts = [0; 4];
            for p in shuffled(&l, seed).parts {
                counts[LETTERS.iter().position(|c| *c == p.answer).expect("a–d")] += 1;
            }
            assert_eq!(counts, [4, 4, 4, 4], "seed {seed}");
        }
        let firsts: std::collections::HashSet<Vec<char>> = (0..50)
            .map(|seed| {
                shuffled(&l, seed).parts[..4]
                    .iter()
                    .map(|p| p.answer)
                    .collect()
            })
            .collect();
        assert!(firsts.len() > 20, "{} openings", firsts.len());
        let repeats = (0..50)
            .filter(|seed| {
                let s = shuffled(&l, *seed);
                s.parts[0].answer == s.parts[1].answer
            })
            .count();
        assert!(repeats > 0, "a letter can be right twice in a row");
    }

    /// Three-choice parts never get 'd'; a two-choice part never 'c'.
    #[test]
    fn a_part_s_answer_is_one_of_its_letters() {
        let l = lesson((0..15).map(|i| part(2 + i % 3, 'a')).collect());
        for seed in 0..100 {
            for (p, shown) in l.parts.iter().zip(shuffled(&l, seed).parts) {
                let at = LETTERS
                    .iter()
                    .position(|c| *c == shown.answer)
                    .expect("a–d");
                assert!(at < p.choices.len(), "seed {seed}");
            }
        }
    }
}
