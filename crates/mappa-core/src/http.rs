//! Helpers shared by mappa's HTTP clients (the coach's and the inference
//! engine's): API keys read from the environment, and short excerpts of
//! replies for error messages.

/// The API key in the environment variable `var` (none when no variable
/// is named). A named variable that is unset or empty is an error naming
/// the manifest field `field` that named it. The key is only returned,
/// never written or printed.
pub fn api_key_from_env(var: Option<&str>, field: &str) -> Result<Option<String>, String> {
    match var {
        Some(var) => match std::env::var(var) {
            Ok(key) if !key.is_empty() => Ok(Some(key)),
            _ => Err(format!(
                "{field}: the environment variable {var} is not set"
            )),
        },
        None => Ok(None),
    }
}

/// The first 300 characters of a reply, with "..." when cut.
pub fn snippet(text: &str) -> String {
    let cut: String = text.chars().take(300).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_named_variable_and_a_missing_one_is_named() {
        assert_eq!(api_key_from_env(None, "x.api_key_env"), Ok(None));
        let err =
            api_key_from_env(Some("MAPPA_SURELY_UNSET_KEY_VAR"), "x.api_key_env").unwrap_err();
        assert!(err.contains("x.api_key_env") && err.contains("MAPPA_SURELY_UNSET_KEY_VAR"));
    }

    #[test]
    fn long_replies_are_cut() {
        assert_eq!(snippet("short"), "short");
        let long = "é".repeat(400);
        assert_eq!(snippet(&long).chars().count(), 303);
    }
}
