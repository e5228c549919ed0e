//! The rules for names and free text that users choose.

use std::sync::LazyLock;

use regex::Regex;

use crate::error::ApiError;

static TENANT_NAME: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal, checked by the tests
    Regex::new(r"^[a-z][a-z0-9-]{2,62}$").unwrap()
});
static USER_NAME: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal, checked by the tests
    Regex::new(r"^[a-z][a-z0-9._-]{1,62}$").unwrap()
});
static GPU_MODEL: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::unwrap_used)] // a literal, checked by the tests
    Regex::new(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$").unwrap()
});

pub fn is_tenant_name(name: &str) -> bool {
    TENANT_NAME.is_match(name)
}

/// Whether `name` is a valid user name.
pub fn is_user_name(name: &str) -> bool {
    USER_NAME.is_match(name)
}

pub fn tenant_name(field: &str, name: &str) -> Result<(), ApiError> {
    if TENANT_NAME.is_match(name) {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "must match [a-z][a-z0-9-]{2,62}: 3–63 lowercase letters, digits and dashes, starting with a letter",
        ))
    }
}

pub fn user_name(field: &str, name: &str) -> Result<(), ApiError> {
    if USER_NAME.is_match(name) {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "must match [a-z][a-z0-9._-]{1,62}: 2–63 lowercase letters, digits, dots, underscores and dashes, starting with a letter",
        ))
    }
}

pub fn gpu_model(field: &str, model: &str) -> Result<(), ApiError> {
    if GPU_MODEL.is_match(model) {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "GPU model names are 1–64 letters, digits, dots, underscores and dashes",
        ))
    }
}

/// Free text: bounded length, no control characters (they break tables,
/// logs and terminals).
pub fn text(field: &str, value: &str, max_chars: usize) -> Result<(), ApiError> {
    if value.chars().count() > max_chars {
        return Err(ApiError::field(
            field,
            format!("at most {max_chars} characters"),
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\n') {
        return Err(ApiError::field(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// A Linux network interface name: 1 to 15 characters, none of them
/// `/`, `:`, whitespace or a control character, and not `.` or `..`.
pub fn interface(field: &str, value: &str) -> Result<(), ApiError> {
    let ok = (1..=15).contains(&value.len())
        && value != "."
        && value != ".."
        && value
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '/' && c != ':');
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "an interface name: 1 to 15 characters, no `/`, `:` or spaces",
        ))
    }
}

/// An agent's transfer address: `http://HOST:PORT` or `https://…`, an
/// authority only (the agent serves fixed paths under it).
pub fn transfer_url(field: &str, value: &str) -> Result<(), ApiError> {
    let authority = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"));
    let ok = value.len() <= 200
        && authority.is_some_and(|a| {
            !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:[]_".contains(c))
        });
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(
            field,
            "http://HOST:PORT or https://HOST:PORT, at most 200 characters",
        ))
    }
}

/// Text from outside that must be kept rather than refused (a claim of an
/// identity provider): control characters become spaces, the ends are
/// trimmed and at most `max_chars` characters stay.
pub fn cleaned(value: &str, max_chars: usize) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .chars()
        .take(max_chars)
        .collect()
}

pub fn email(field: &str, value: &str) -> Result<(), ApiError> {
    text(field, value, 254)?;
    let ok = value.split_once('@').is_some_and(|(local, domain)| {
        !local.is_empty() && domain.contains('.') && !value.contains(char::is_whitespace)
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::field(field, "not an e-mail address"))
    }
}

/// Where to send a browser after sign-in: a path on this site, or `/`.
/// One leading `/` and no second (`//host` is another site), no `\\`
/// (`/\\host` is one too, to browsers), and no control characters:
/// browsers drop tabs and line ends from URLs, so `/\t/host` would become
/// `//host`.
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.contains('\\')
                && !n.chars().any(char::is_control)
                && n.len() <= 512 =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn transfer_urls_are_an_authority_only() {
        for ok in [
            "http://127.0.0.1:7702",
            "https://host-1.example:443",
            "http://[fd00::1]:80",
        ] {
            assert!(transfer_url("t", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "ftp://x",
            "http://",
            "http://a/b",
            "http://a b",
            "http://a?x",
            "http://user@host",
        ] {
            assert!(transfer_url("t", bad).is_err(), "{bad:?}");
        }
    }
    use super::*;

    #[test]
    fn claims_are_cleaned_not_refused() {
        assert_eq!(cleaned("Aiko\u{1b}[31m Tanaka\n", 200), "Aiko [31m Tanaka");
        assert_eq!(cleaned("山田\0太郎", 200), "山田 太郎");
        assert_eq!(cleaned(&"x".repeat(300), 200).len(), 200);
        assert!(email("e", "a\u{7f}@lab.ac.jp").is_err());
        assert!(email("e", "a@lab.ac.jp").is_ok());
    }

    #[test]
    fn tenant_names() {
        for ok in [
            "abc",
            "proj-1",
            "a23456789012345678901234567890123456789012345678901234567890123",
        ] {
            assert!(tenant_name("name", ok).is_ok(), "{ok}");
        }
        for bad in [
            "ab",
            "1abc",
            "Abc",
            "a_b",
            "abc ",
            "",
            "a234567890123456789012345678901234567890123456789012345678901234",
        ] {
            assert!(tenant_name("name", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn user_names() {
        assert!(user_name("name", "alice.smith").is_ok());
        assert!(user_name("name", "a").is_err());
        assert!(user_name("name", "alice@x").is_err());
    }

    #[test]
    fn gpu_models() {
        assert!(gpu_model("gpus", "H100-SXM5-80GB").is_ok());
        assert!(gpu_model("gpus", "").is_err());
        assert!(gpu_model("gpus", "h100 pcie").is_err());
    }

    #[test]
    fn free_text() {
        assert!(text("d", "line\nline", 20).is_ok());
        assert!(text("d", "bell\u{7}", 20).is_err());
        assert!(text("d", "ぐ".repeat(20).as_str(), 20).is_ok());
        assert!(text("d", "ぐ".repeat(21).as_str(), 20).is_err());
    }

    #[test]
    fn emails() {
        assert!(email("email", "a@u-tokyo.ac.jp").is_ok());
        assert!(email("email", "a@localhost").is_err());
        assert!(email("email", "@x.jp").is_err());
        assert!(email("email", "a b@x.jp").is_err());
    }

    #[test]
    fn only_local_paths_are_next() {
        assert_eq!(safe_next(Some("/vms?x=1")), "/vms?x=1");
        for bad in [
            "//evil.example",
            "https://evil.example",
            "/\\evil",
            "",
            "/\t/evil.example/x",
            "/\n/evil.example",
            "/\r\n/evil.example",
            "/\u{0}/evil.example",
            "/\u{7f}/x",
        ] {
            assert_eq!(safe_next(Some(bad)), "/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/");
    }
}
