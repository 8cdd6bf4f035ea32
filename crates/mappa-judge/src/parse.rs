//! Reading `PROCESS_SCORE: x` and `ANSWER_CORRECT: 0|1` out of a coach reply.

use std::sync::OnceLock;

use regex::Regex;

/// What a reply yielded.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedReply {
    /// The first `PROCESS_SCORE`, clamped to [0, 10].
    pub score: Option<f64>,
    /// The first `ANSWER_CORRECT` (0 or 1).
    pub answer_correct: Option<bool>,
    /// The text before the score line, trimmed (the analysis).
    pub rationale: String,
}

impl ParsedReply {
    /// Whether the reply has everything asked for.
    pub fn is_complete(&self, needs_answer_correct: bool) -> bool {
        self.score.is_some() && (!needs_answer_correct || self.answer_correct.is_some())
    }
}

fn score_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Tolerates markdown emphasis around the key: **PROCESS_SCORE:** 7, **PROCESS_SCORE**: 7.
    RE.get_or_init(|| {
        Regex::new(r"(?i)PROCESS_SCORE\**\s*:\s*\**\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))")
            .expect("valid regex")
    })
}

fn answer_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)ANSWER_CORRECT\**\s*:\s*\**\s*([01])\b").expect("valid regex")
    })
}

/// Parse a reply: the first `PROCESS_SCORE` (case-insensitive), clamped to
/// [0, 10]; the first `ANSWER_CORRECT`; the analysis before the score.
pub fn parse_reply(reply: &str) -> ParsedReply {
    let score_match = score_re().captures(reply);
    let score = score_match
        .as_ref()
        .and_then(|c| c[1].parse::<f64>().ok())
        .filter(|s| s.is_finite())
        // `-0` reads as 0, not as a negative zero that prints "-0".
        .map(|s| if s == 0.0 { 0.0 } else { s.clamp(0.0, 10.0) });
    let answer_correct = answer_re().captures(reply).map(|c| &c[1] == "1");
    let cut = score_match
        .and_then(|c| c.get(0))
        .map_or(reply.len(), |m| m.start());
    let rationale = reply[..cut].trim().trim_end_matches('*').trim().to_string();
    ParsedReply {
        score,
        answer_correct,
        rationale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_score_wins_and_is_clamped() {
        let r = parse_reply("Good work.\nprocess_score: 7.5\nPROCESS_SCORE: 2");
        assert_eq!(r.score, Some(7.5));
        assert_eq!(r.rationale, "Good work.");
        assert_eq!(parse_reply("PROCESS_SCORE: 14").score, Some(10.0));
        assert_eq!(parse_reply("PROCESS_SCORE: -3").score, Some(0.0));
        assert_eq!(parse_reply("**PROCESS_SCORE:** 8").score, Some(8.0));
        assert_eq!(parse_reply("**PROCESS_SCORE**: 6.").score, Some(6.0));
    }

    #[test]
    fn missing_or_malformed_scores_are_none() {
        assert_eq!(parse_reply("I'd give it an eight").score, None);
        assert_eq!(parse_reply("PROCESS_SCORE: high").score, None);
        assert_eq!(parse_reply("").score, None);
        // Too large for an f64: rejected, not infinite.
        let huge = format!("PROCESS_SCORE: {}", "9".repeat(400));
        assert_eq!(parse_reply(&huge).score, None);
        // Digits of other scripts match `\d` but are not numbers.
        assert_eq!(parse_reply("PROCESS_SCORE: ٧").score, None);
    }

    #[test]
    fn negative_zero_reads_as_zero() {
        let score = parse_reply("PROCESS_SCORE: -0.0").score.unwrap();
        assert!(score == 0.0 && score.is_sign_positive(), "{score}");
    }

    #[test]
    fn answer_correct_is_read_when_present() {
        let r = parse_reply("ok\nPROCESS_SCORE: 9\nANSWER_CORRECT: 1");
        assert_eq!(r.answer_correct, Some(true));
        assert!(r.is_complete(true));
        let r = parse_reply("PROCESS_SCORE: 9\nANSWER_CORRECT: 2");
        assert_eq!(r.answer_correct, None);
        assert!(!r.is_complete(true));
        assert!(r.is_complete(false));
    }
}
