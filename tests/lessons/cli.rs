//! `lessons` and a headless `lesson` as a script sees them: the listing,
//! the text, the JSON with each part's run and checks, and a seed that
//! orders the choices alike in the text, the JSON and the handout.

use super::*;

#[test]
fn lessons_lists_the_built_ins() {
    let (code, out, err) = vramscope(&["lessons"]);
    assert_eq!(code, 0, "{err}");
    for name in [
        "caching-allocator",
        "leaks",
        "training-peak",
        "efficient-training",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{out}"
        );
    }
    assert!(out.contains("45 min"), "{out}");
}
#[test]
fn a_lesson_without_a_terminal_prints_as_text() {
    let (code, out, err) = vramscope(&["lesson", "leaks"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("lesson leaks: "), "{out}");
    assert!(
        out.contains("── part 1 of 11 · scenario accumulate-loss-train-bug"),
        "{out}"
    );
    assert!(out.contains("\n  a) "), "choices are listed");
    // The answer the text gives is the file's right choice, at the letter
    // the text lists it under.
    let file = resolve_lesson("leaks").expect("loads").lesson;
    let right = &file.parts[0].choices[right_choice(&file.parts[0])];
    let (letter, given) = out
        .split_once("\nanswer: ")
        .and_then(|(_, rest)| rest.split_once(") "))
        .map(|(l, rest)| (l.to_string(), rest.lines().next().unwrap_or("").to_string()))
        .expect("an answer line");
    assert_eq!(&given, right, "{out}");
    assert!(
        out.contains(&format!("\n  {letter}) {right}\n")),
        "the answer's letter is where the question lists it:\n{out}"
    );
    assert!(out.contains("the run: "), "{out}");
    assert!(out.contains("[ok] a leak rooted at `val_total`"), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    assert!(out.contains("── summary ──"), "{out}");
    let (code, again, _) = vramscope(&["lesson", "leaks", "--headless"]);
    assert_eq!((code, again), (0, out));
}
/// `lesson --json` carries each part's question and answer and the figures
/// of its run, the same figures `run --json` reports for that scenario.
#[test]
fn a_lesson_as_json_carries_each_part_s_run_and_checks() {
    let (code, out, err) = vramscope(&["lesson", "leaks", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["name"], "leaks");
    assert_eq!(v["holds"], true);
    let parts = v["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 11);
    let first = &parts[0];
    assert_eq!(first["scenario"], "accumulate-loss-train-bug");
    let file = resolve_lesson("leaks").expect("loads").lesson;
    let letter = first["answer"].as_str().expect("a letter");
    let at = LETTERS
        .iter()
        .position(|l| letter == l.to_string())
        .expect("a–d");
    assert_eq!(
        first["choices"][at].as_str(),
        Some(file.parts[0].choices[right_choice(&file.parts[0])].as_str()),
        "the answer names the right choice in the order shown"
    );
    assert_eq!(v["seed"], default_seed("leaks"));
    assert!(first["checks"].as_array().is_some_and(|c| !c.is_empty()));
    let (code, run, err) = vramscope(&["run", "accumulate-loss-train-bug", "--json"]);
    assert_eq!(code, 0, "{err}");
    let run: serde_json::Value = serde_json::from_str(&run).expect("run JSON");
    for key in ["peak_allocated", "peak_reserved"] {
        assert!(run[key].as_u64().is_some_and(|b| b > 0), "{key}: {run}");
        assert_eq!(first["run"][key], run[key], "{key}");
    }
    assert_eq!(first["run"]["iterations"], run["iterations_run"]);
}
#[test]
fn a_lesson_whose_run_does_not_show_its_answer_says_so_in_json() {
    let dir = temp_dir("json-wrong");
    let path = dir.join("lesson.ron");
    std::fs::write(&path, LESSON.replace("SCENARIO", "store-outputs-bug")).expect("write");
    let (code, out, _) = vramscope(&["lesson", &path.display().to_string(), "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["holds"], false);
    assert_eq!(v["parts"][0]["run"]["oom_iteration"], 52);
    assert_eq!(v["parts"][0]["checks"][0]["passed"], false);
}
/// Each part's (choices, answer letter) as `lesson --json` shows them.
fn shown_order(args: &[&str]) -> Vec<(Vec<String>, String)> {
    let (code, out, err) = vramscope(args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    v["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .map(|p| {
            let choices = p["choices"]
                .as_array()
                .expect("choices")
                .iter()
                .map(|c| c.as_str().expect("text").to_string())
                .collect();
            (choices, p["answer"].as_str().expect("letter").to_string())
        })
        .collect()
}
/// One order per seed: the default is the lesson's own seed, another seed
/// reorders the choices, and the answer follows its text; the handout lists
/// the same order without answers, and the key gives the same letters.
#[test]
fn a_seed_orders_the_text_the_json_and_the_handout_alike() {
    let file = resolve_lesson("leaks").expect("loads").lesson;
    let own = default_seed("leaks").to_string();
    let default = shown_order(&["lesson", "leaks", "--json"]);
    assert_eq!(
        default,
        shown_order(&["lesson", "leaks", "--json", "--seed", &own])
    );
    let other = shown_order(&["lesson", "leaks", "--json", "--seed", "12345"]);
    assert_ne!(default, other, "another seed, another order");
    for shown in [&default, &other] {
        for ((choices, letter), part) in shown.iter().zip(&file.parts) {
            let at = LETTERS
                .iter()
                .position(|l| *letter == l.to_string())
                .expect("a–d");
            assert_eq!(choices[at], part.choices[right_choice(part)]);
        }
    }

    let (code, handout, err) = vramscope(&["lesson", "leaks", "--handout", "--seed", "12345"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        handout.starts_with(&format!("# {}\n", file.title)),
        "{handout}"
    );
    assert!(handout.contains("seed 12345"), "{handout}");
    let mut from = 0;
    for (i, ((choices, _), part)) in other.iter().zip(&file.parts).enumerate() {
        let q = format!("## Question {}\n", i + 1);
        let at = handout[from..].find(&q).map(|k| k + from).expect(&q);
        let list: String = LETTERS
            .iter()
            .zip(choices)
            .map(|(l, c)| format!("- **{l})** {c}\n"))
            .collect();
        assert!(
            handout[at..].contains(&list),
            "{q} lists its choices in order"
        );
        for p in &part.explanation {
            assert!(!handout.contains(p.as_str()), "an explanation is an answer");
        }
        from = at + q.len();
    }

    let (code, key, err) = vramscope(&["lesson", "leaks", "--answers", "--seed", "12345"]);
    assert_eq!(code, 0, "{err}");
    assert!(key.contains("seed 12345"), "{key}");
    for (i, ((choices, letter), part)) in other.iter().zip(&file.parts).enumerate() {
        let at = LETTERS
            .iter()
            .position(|l| *letter == l.to_string())
            .expect("a–d");
        let line = format!("{}. **{letter})** {}\n", i + 1, choices[at]);
        assert!(key.contains(&line), "{line} in\n{key}");
        assert!(key.contains(part.explanation[0].as_str()), "{key}");
    }
    let (code, _, err) = vramscope(&["lesson", "leaks", "--handout", "--json"]);
    assert_eq!(code, 2, "a handout is Markdown, not JSON: {err}");
}
