//! Hostile coach replies and coach configurations (issue 15): `parse_reply`
//! reads whatever an LLM sends back, so it must never panic, and a score it
//! returns must be a finite number in [0, 10] (anything else is rejected as
//! no score); `CoachConfig::load` reads a user's file, so a broken one must
//! be an error naming the file, never a panic.
//!
//! Cases per run (fixed, so that CI runs a bounded number):
//!
//! | property | cases |
//! |---|---|
//! | `any_text_parses_without_panicking` | 512 |
//! | `score_lines_read_as_written_or_not_at_all` | 512 |
//! | `mutated_coach_configs_load_or_name_the_file` | 256 |
//!
//! 1280 cases in all.

use mappa_judge::config::CoachConfig;
use mappa_judge::parse::parse_reply;
use proptest::prelude::*;
use proptest::sample::select;

/// Checks what holds for every reply: a score is finite, in [0, 10] and not
/// a negative zero; the rationale is a trimmed piece of the reply.
fn check_invariants(reply: &str) -> Result<(), TestCaseError> {
    let parsed = parse_reply(reply);
    if let Some(score) = parsed.score {
        prop_assert!(
            score.is_finite() && (0.0..=10.0).contains(&score) && score.is_sign_positive(),
            "score {score} from {reply:?}"
        );
    }
    prop_assert!(reply.contains(&parsed.rationale), "{:?}", parsed.rationale);
    prop_assert_eq!(parsed.rationale.trim(), parsed.rationale.as_str());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary text, printable or not, with the keys sprinkled in.
    #[test]
    fn any_text_parses_without_panicking(
        pieces in proptest::collection::vec(
            prop_oneof![
                "\\PC{0,16}",
                ".{0,16}",
                select(vec![
                    "PROCESS_SCORE", "process_score", "ANSWER_CORRECT", ":", "**", "\u{0}",
                    "\u{202e}", "\u{fe0f}", "٧", "７", "𝟕", "e308", "-", "+", ".", "\n",
                ]).prop_map(String::from),
            ],
            0..12,
        ),
    ) {
        check_invariants(&pieces.concat())?;
    }

    /// A score line in many spellings: when the number is plain ASCII and
    /// finite, it reads as written (clamped to [0, 10]); otherwise as none.
    #[test]
    fn score_lines_read_as_written_or_not_at_all(
        before in "\\PC{0,40}",
        key in select(vec!["PROCESS_SCORE", "process_score", "Process_Score", "**PROCESS_SCORE**", "**PROCESS_SCORE:**"]),
        gap in select(vec![": ", ":", " : ", ":\n**", ":\t"]),
        number in prop_oneof![
            4 => (-1e3f64..1e3).prop_map(|x| format!("{x}")),
            2 => (0u32..=10).prop_map(|x| x.to_string()),
            1 => select(vec![
                "NaN", "nan", "inf", "-inf", "infinity", "1e999", "-0", "+0", "-0.0",
                ".5", "7.", "+7", "10.0000001", "٧", "７", "0x10", "1_000",
                "99999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999",
            ]).prop_map(String::from),
        ],
        after in "\\PC{0,40}",
    ) {
        // `before` must not hold a score line of its own.
        prop_assume!(!before.to_ascii_lowercase().contains("process_score"));
        // `**PROCESS_SCORE:**` already has its colon.
        let gap = if key.ends_with(":**") { " " } else { gap };
        let reply = format!("{before}\n{key}{gap}{number}{after}");
        check_invariants(&reply)?;
        let expected = leading_number(&number)
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|x| x.is_finite())
            .map(|x| if x == 0.0 { 0.0 } else { x.clamp(0.0, 10.0) });
        // Digits right after the number (from `after`) would extend it;
        // check the cases where it ends cleanly.
        if !after.starts_with(|c: char| c.is_numeric() || c == '.') {
            prop_assert_eq!(parse_reply(&reply).score, expected, "{:?}", reply);
        }
    }
}

/// The plain decimal at the start of `s` (sign, ASCII digits, one point),
/// which is all of a score that is read: `8/10` is 8, `1e999` is 1.
fn leading_number(s: &str) -> Option<&str> {
    let body = s.trim_start_matches(['+', '-']);
    let sign = s.len() - body.len();
    if sign > 1 {
        return None;
    }
    let int = body.bytes().take_while(u8::is_ascii_digit).count();
    let frac = match body[int..].strip_prefix('.') {
        Some(rest) => 1 + rest.bytes().take_while(u8::is_ascii_digit).count(),
        None => 0,
    };
    let digits = int + frac.saturating_sub(1);
    (digits > 0).then(|| &s[..sign + int + frac])
}

/// A complete coach configuration, every table present (one judge).
const COACH_TOML: &str = r#"domain = "mathchat"
cache = "cache.sqlite"
cache_mode = "read-write"

[settings]
coach_sees_ground_truth = true
fallback_score = 5.0
temperature = 0.0
max_tokens = 1024
max_concurrency = 8
max_failed_fraction = 0.05
on_outage = "stop"
max_outage_wait_s = 3600.0
outage_poll_s = 30.0

[openai]
base_url = "http://127.0.0.1:8000/v1"
model = "judge"
timeout_s = 120.0
max_attempts = 6
requests_per_minute = 60.0
"#;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The configuration with lines dropped, values replaced by values of
    /// other types and sizes, and bytes cut off: it loads, or the error
    /// names the file; a configuration that loads has valid settings, and
    /// building its coach never panics.
    #[test]
    fn mutated_coach_configs_load_or_name_the_file(
        edits in proptest::collection::vec(
            (0usize..24, select(vec![
                "", "-1", "0", "1e309", "nan", "inf", "\"\"", "\"x\"", "[]", "{}", "true",
                "18446744073709551616", "\"wait\"", "\"replay\"", "\"off\"", "2.5",
            ])),
            0..4,
        ),
        cut in proptest::option::of(0usize..700),
    ) {
        let mut lines: Vec<String> = COACH_TOML.lines().map(String::from).collect();
        for (at, value) in edits {
            let at = at % lines.len();
            lines[at] = match lines[at].split_once(" = ") {
                Some((key, _)) if !value.is_empty() => format!("{key} = {value}"),
                _ => String::new(),
            };
        }
        let mut text = lines.join("\n");
        if let Some(cut) = cut {
            let mut cut = cut.min(text.len());
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coach.toml");
        std::fs::write(&path, &text).unwrap();
        match CoachConfig::load(&path) {
            Ok(config) => {
                prop_assert!(config.settings.validate().is_ok());
                if let Err(e) = config.build() {
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("coach.toml"), "{e}"),
        }
    }
}
