//! API tokens and the caller they authenticate.
//!
//! A token is `kumo_<id>_<secret>`: the id (32 hex digits) finds the row, the
//! secret (32 random bytes, 43 base64url characters) is checked against its
//! SHA-256. A slow hash such as argon2 protects low-entropy passwords; a
//! 256-bit random secret gains nothing from it and would cost every request.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use sea_orm::{ActiveModelTrait, DatabaseConnection, EntityTrait, Set};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use crate::context::Caller;
use crate::entity::{api_tokens, users};
use crate::error::ApiError;

const PREFIX: &str = "kumo_";
/// Join tokens register hosts; host credentials authenticate agents.
pub const JOIN_PREFIX: &str = "kumoj_";
pub const HOST_PREFIX: &str = "kumoh_";
/// Console tickets open a VM's serial console once.
pub const CONSOLE_PREFIX: &str = "kumoc_";
/// `last_used_at` is refreshed at most this often, so that reads do not
/// turn into a write per request.
const LAST_USED_GRANULARITY_SECS: i64 = 60;

/// A freshly minted token: the string to hand out once, and what to store.
pub struct MintedToken {
    pub id: Uuid,
    pub token: String,
    pub secret_hash: String,
}

pub fn mint() -> MintedToken {
    mint_prefixed(PREFIX, Uuid::now_v7())
}

/// A secret of another kind (`kumoj_`, `kumoh_`) for a given id.
pub fn mint_prefixed(prefix: &str, id: Uuid) -> MintedToken {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let secret = URL_SAFE_NO_PAD.encode(secret);
    MintedToken {
        id,
        token: format!("{prefix}{}_{secret}", id.simple()),
        secret_hash: hash_secret(&secret),
    }
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Splits a presented token into its id and secret, or `None` when it has
/// not the token's shape.
pub fn parse(token: &str) -> Option<(Uuid, &str)> {
    parse_prefixed(token, PREFIX)
}

pub fn parse_prefixed<'a>(token: &'a str, prefix: &str) -> Option<(Uuid, &'a str)> {
    let rest = token.strip_prefix(prefix)?;
    let (id, secret) = rest.split_once('_')?;
    if id.len() != 32 || secret.is_empty() || secret.len() > 128 {
        return None;
    }
    Some((Uuid::try_parse(id).ok()?, secret))
}

/// Whether a string has the shape of a secret Kumo mints (an API token,
/// a join token, a host credential or a console ticket). Every secret
/// carries its prefix so that it can be recognised wherever it should not
/// be kept.
pub fn is_secret(s: &str) -> bool {
    [PREFIX, JOIN_PREFIX, HOST_PREFIX, CONSOLE_PREFIX]
        .iter()
        .any(|p| parse_prefixed(s, p).is_some())
}

/// Compares in constant time, so timing does not reveal the hash.
pub fn secret_matches(secret: &str, stored_hash: &str) -> bool {
    bool::from(hash_secret(secret).as_bytes().ct_eq(stored_hash.as_bytes()))
}

/// Checks a bearer token against the database. Every failure reads the
/// same to the client, so that a probe learns nothing about which tokens exist.
pub async fn authenticate(
    db: &DatabaseConnection,
    token: &str,
    now: DateTime<Utc>,
) -> Result<Caller, ApiError> {
    let invalid = || ApiError::Unauthenticated("invalid, expired or revoked token".into());
    let (id, secret) = parse(token).ok_or_else(invalid)?;
    let row = api_tokens::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or_else(invalid)?;
    if !secret_matches(secret, &row.secret_hash) {
        return Err(invalid());
    }
    if row.revoked_at.is_some() || row.expires_at.is_some_and(|e| e <= now) {
        return Err(invalid());
    }
    let user = users::Entity::find_by_id(row.user_id)
        .one(db)
        .await?
        .filter(|u| !u.disabled)
        .ok_or_else(invalid)?;
    let stale = row
        .last_used_at
        .is_none_or(|t| (now - t).num_seconds() >= LAST_USED_GRANULARITY_SECS);
    if stale {
        let mut active: api_tokens::ActiveModel = row.clone().into();
        active.last_used_at = Set(Some(now));
        active.update(db).await?;
    }
    Ok(Caller {
        user,
        token_id: row.id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_parse_back_and_match_their_hash() {
        let t = mint();
        let (id, secret) = parse(&t.token).unwrap();
        assert_eq!(id, t.id);
        assert_eq!(hash_secret(secret), t.secret_hash);
        assert!(t.token.starts_with("kumo_"));
        // 256 bits of secret.
        assert_eq!(secret.len(), 43);
    }

    #[test]
    fn two_tokens_never_share_a_secret() {
        let a = mint();
        let b = mint();
        assert_ne!(a.secret_hash, b.secret_hash);
        assert_ne!(a.id, b.id);
    }

    #[test]
    fn malformed_tokens_do_not_parse() {
        for bad in [
            "",
            "kumo_",
            "kumo_abc_def",
            "bearer",
            "kumo_0123456789abcdef0123456789abcdef_",
            "kumo_0123456789abcdef0123456789abcdeg_secret",
            "xkumo_0123456789abcdef0123456789abcdef_secret",
        ] {
            assert!(parse(bad).is_none(), "{bad}");
        }
        assert!(parse("kumo_0123456789abcdef0123456789abcdef_secret").is_some());
    }
}
