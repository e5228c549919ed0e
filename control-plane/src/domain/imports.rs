//! What the destination's report on a move (a volume's, or a shelved VM's
//! root disk) changes while the copy goes on: pure.

use kumo_api_types::{VolumeActual, VolumeStatus};

use crate::domain::names;

/// The change an `importing` or `failed` report makes to a move's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// A new hash of the destination's token, to keep and hand to the
    /// source (which is then woken).
    pub token: Option<String>,
    /// The reason to show.
    pub reason: Option<String>,
}

/// What an `importing` or `failed` report changes, given the row's token
/// hash and reason: `None` when nothing. A failure's reason is `what: why`;
/// while the copy goes on the reason is `meanwhile`. Only a well-formed
/// hash (64 hex digits) is taken, lowercased.
pub fn progress(
    s: &VolumeStatus,
    stored_token: Option<&str>,
    stored_reason: Option<&str>,
    what: &str,
    meanwhile: Option<&str>,
) -> Option<Progress> {
    let token = s
        .token_sha256
        .as_deref()
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
        .filter(|t| Some(t.as_str()) != stored_token);
    let reason = match s.state {
        VolumeActual::Failed => {
            let why = s.reason.as_deref().unwrap_or("failed");
            Some(names::cleaned(&format!("{what}: {why}"), 500))
        }
        _ => meanwhile.map(str::to_owned),
    };
    (token.is_some() || reason.as_deref() != stored_reason).then_some(Progress { token, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(state: VolumeActual, token: Option<&str>, reason: Option<&str>) -> VolumeStatus {
        VolumeStatus {
            id: uuid::Uuid::nil(),
            state,
            size_gib: None,
            reason: reason.map(str::to_owned),
            snapshots: Vec::new(),
            token_sha256: token.map(str::to_owned),
        }
    }

    #[test]
    fn a_new_token_is_kept_once_and_failures_say_why() {
        let t = "AB".repeat(32);
        let p = progress(
            &report(VolumeActual::Importing, Some(&t), None),
            None,
            None,
            "x",
            None,
        );
        assert_eq!(p.unwrap().token, Some("ab".repeat(32)), "lowercased");
        let same = progress(
            &report(VolumeActual::Importing, Some(&t), None),
            Some(&"ab".repeat(32)),
            None,
            "x",
            None,
        );
        assert_eq!(same, None, "nothing new");
        let bad = progress(
            &report(VolumeActual::Importing, Some("zz"), None),
            None,
            None,
            "x",
            None,
        );
        assert_eq!(bad, None, "a malformed hash is not taken");
        let failed = progress(
            &report(VolumeActual::Failed, None, Some("404\u{7}")),
            None,
            None,
            "copying",
            Some("moving"),
        )
        .unwrap();
        assert_eq!(
            (failed.token, failed.reason.as_deref()),
            (None, Some("copying: 404"))
        );
        let back = progress(
            &report(VolumeActual::Importing, None, None),
            None,
            Some("copying: 404"),
            "copying",
            Some("moving"),
        );
        assert_eq!(
            back.unwrap().reason.as_deref(),
            Some("moving"),
            "the copy goes on"
        );
    }
}
