//! The two callouts above a run's timeline: the narration of the moment, in
//! full wherever the screen has the rows, and an error the run reported,
//! shown beside it (never instead of it). The text is word-wrapped here, so
//! the layout sizes each box by the rows its view then draws.

use std::sync::Arc;

use super::views::one_line;

/// A box's top and bottom borders.
pub const BORDERS: u16 = 2;
/// Rows of an error's text in its callout; `e` shows the whole message.
pub const ERROR_ROWS: usize = 2;

/// `text` in rows of at most `width` characters, broken between words; a
/// word longer than a row is broken where the row ends.
pub fn word_wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut rows = Vec::new();
    let mut row = String::new();
    let mut row_len = 0;
    for word in text.split_whitespace() {
        let mut chars: Vec<char> = word.chars().collect();
        let sep = usize::from(row_len > 0);
        if row_len + sep + chars.len() <= width {
            if sep == 1 {
                row.push(' ');
            }
            row.extend(&chars);
            row_len += sep + chars.len();
            continue;
        }
        if row_len > 0 {
            rows.push(std::mem::take(&mut row));
        }
        while chars.len() > width {
            rows.push(chars.drain(..width).collect());
        }
        row = chars.iter().collect();
        row_len = chars.len();
    }
    if row_len > 0 || rows.is_empty() {
        rows.push(row);
    }
    rows
}

/// The narration's rows for a box `width` wide inside: each thing said as
/// one paragraph, in the order said.
pub fn narration_rows(said: &[Arc<str>], width: usize) -> Vec<String> {
    said.iter()
        .flat_map(|t| word_wrap(&one_line(t), width))
        .collect()
}

/// The first `max` rows of an error, `…` where it goes on. An error in
/// paragraphs (an OOM's message, then the answer at it: a blank line
/// between) gives each paragraph its first row before any takes a second,
/// so the answer's first line is in view, not under the message.
pub fn error_rows(text: &str, width: usize, max: usize) -> Vec<String> {
    let max = max.max(1);
    let paragraphs: Vec<Vec<String>> = text
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| word_wrap(&one_line(p), width))
        .collect();
    if paragraphs.len() <= 1 {
        let mut rows = word_wrap(&one_line(text), width);
        if rows.len() > max {
            rows.truncate(max);
            if let Some(last) = rows.last_mut() {
                cut_with_ellipsis(last, width);
            }
        }
        return rows;
    }
    // Rows per paragraph: one each in order while the room lasts, then the
    // first paragraph takes what is left.
    let mut take = vec![0usize; paragraphs.len()];
    let mut left = max;
    for (i, p) in paragraphs.iter().enumerate() {
        if left == 0 {
            break;
        }
        take[i] = 1.min(p.len());
        left -= take[i];
    }
    while left > 0 && take[0] < paragraphs[0].len() {
        take[0] += 1;
        left -= 1;
    }
    let mut rows = Vec::new();
    let shown = take.iter().filter(|t| **t > 0).count();
    for (i, (p, &k)) in paragraphs.iter().zip(&take).enumerate() {
        if k == 0 {
            continue;
        }
        let cut = k < p.len() || (i + 1 == shown && shown < paragraphs.len());
        rows.extend(p.iter().take(k).cloned());
        if cut {
            if let Some(last) = rows.last_mut() {
                cut_with_ellipsis(last, width);
            }
        }
    }
    rows
}

/// `row` ending in `…`, within `width` characters.
pub fn cut_with_ellipsis(row: &mut String, width: usize) {
    let keep = width.saturating_sub(1).min(row.chars().count());
    *row = row.chars().take(keep).collect::<String>() + "…";
}

/// Heights, borders included, of the narration and error callouts of a
/// column `width` wide that can give them `room` rows: the narration every
/// row it needs within the room (at least one), the error its first rows, or
/// its first row alone where the narration needs the rest.
pub fn heights(said: &[Arc<str>], error: Option<&str>, width: u16, room: u16) -> (u16, u16) {
    let inner = usize::from(width.saturating_sub(BORDERS));
    let err_full = error.map_or(0, |e| {
        error_rows(e, inner, ERROR_ROWS).len() as u16 + BORDERS
    });
    if said.is_empty() {
        return (
            0,
            if err_full.min(room) > BORDERS {
                err_full.min(room)
            } else {
                0
            },
        );
    }
    let want = narration_rows(said, inner).len() as u16 + BORDERS;
    let err_h = if want + err_full <= room {
        err_full
    } else {
        err_full.min(BORDERS + 1)
    };
    let narr_h = want.min(room.saturating_sub(err_h)).max(BORDERS + 1);
    if narr_h + err_h <= room {
        return (narr_h, err_h);
    }
    // Too little room for both boxes: they take no more than `room`, so
    // the map keeps its rows. The error (PyTorch's words at the cursor)
    // keeps its first row; the narration takes what is left, if a row.
    let err_h = err_h.min(room);
    let narr_h = room.saturating_sub(err_h);
    let shown = |h: u16| if h > BORDERS { h } else { 0 };
    (shown(narr_h), shown(err_h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_wrap_whole_and_nothing_is_lost() {
        let text = "The validation forward records a graph and saves activations for a backward that never comes.";
        let rows = word_wrap(text, 20);
        assert!(rows.iter().all(|r| r.chars().count() <= 20), "{rows:?}");
        assert_eq!(rows.join(" "), text);
        assert_eq!(word_wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(word_wrap("", 10), [""]);
    }

    #[test]
    fn each_paragraph_of_an_error_shows_its_first_row() {
        let message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 MiB.";
        let text = format!("{message}\n\nat the OOM: the largest holder: preds 408.00 MiB\n\nmore");
        let rows = error_rows(&text, 30, 2);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(rows[0].starts_with("torch.OutOfMemoryError") && rows[0].ends_with('…'));
        assert!(rows[1].starts_with("at the OOM:") && rows[1].ends_with('…'));
        // With room, the first paragraph takes the rest.
        let rows = error_rows(&text, 30, 5);
        assert_eq!(rows.len(), 5, "{rows:?}");
        assert!(rows[1].starts_with("out of memory"), "{rows:?}");
        assert!(rows[3].starts_with("at the OOM:"), "{rows:?}");
        // One paragraph: as before.
        assert_eq!(error_rows(message, 100, 2), [message]);
    }

    #[test]
    fn the_narration_takes_the_rows_it_needs_within_the_room() {
        let said: Vec<Arc<str>> = vec![Arc::from("word ".repeat(40).as_str())];
        // 200 characters in 38-column rows: 6 rows, plus borders.
        assert_eq!(heights(&said, None, 40, 20), (8, 0));
        assert_eq!(heights(&said, None, 40, 5), (5, 0));
        assert_eq!(heights(&said, Some("boom"), 40, 20), (8, 3));
        // Room for one box: the error's (PyTorch's words), never more
        // than the room, so the map keeps its rows.
        assert_eq!(heights(&said, Some("boom"), 40, 3), (0, 3));
        assert_eq!(heights(&said, Some("boom"), 40, 6), (3, 3));
        assert_eq!(heights(&said, Some("boom"), 40, 2), (0, 0));
        let long_error = "x ".repeat(90);
        assert_eq!(heights(&[], Some(&long_error), 40, 20), (0, 4));
        assert_eq!(heights(&said, Some(&long_error), 40, 12), (8, 4));
        assert_eq!(
            heights(&said, Some(&long_error), 40, 11),
            (8, 3),
            "the error gives up a row before the narration does"
        );
    }
}
