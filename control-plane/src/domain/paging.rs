//! Keyset pagination: a page token is the opaque, base64url-encoded sort key
//! of the last item of the previous page, so pages stay stable while rows
//! are added.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::error::ApiError;

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 500;

#[derive(Debug, Clone, PartialEq)]
pub struct Paging {
    pub limit: u64,
    /// The sort key after which this page starts.
    pub after: Option<String>,
}

impl Paging {
    pub fn new(limit: Option<u32>, page_token: Option<&str>) -> Result<Paging, ApiError> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::field(
                "limit",
                format!("must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let after = match page_token {
            None | Some("") => None,
            Some(t) => Some(decode(t)?),
        };
        Ok(Paging {
            limit: u64::from(limit),
            after,
        })
    }

    /// The event id a page of events (newest first, keyed by id) starts
    /// below; `None` on the first page.
    pub fn before_id(&self) -> Result<Option<i64>, ApiError> {
        self.after
            .as_deref()
            .map(|a| {
                a.parse::<i64>().map_err(|_| {
                    ApiError::field("page_token", "not a page token returned by this API")
                })
            })
            .transpose()
    }

    /// Fetch one more row than the page holds to learn whether another page follows.
    pub fn fetch(&self) -> u64 {
        self.limit + 1
    }

    /// Cuts the fetched rows to the page and makes the next token from the
    /// last item's key.
    pub fn finish<T>(
        &self,
        mut rows: Vec<T>,
        key: impl Fn(&T) -> String,
    ) -> (Vec<T>, Option<String>) {
        let more = rows.len() as u64 > self.limit;
        rows.truncate(self.limit as usize);
        let next = if more {
            rows.last().map(|r| encode(&key(r)))
        } else {
            None
        };
        (rows, next)
    }
}

pub fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key.as_bytes())
}

fn decode(token: &str) -> Result<String, ApiError> {
    let bad = || ApiError::field("page_token", "not a page token returned by this API");
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        let p = Paging::new(Some(2), None).unwrap();
        let (rows, next) = p.finish(vec!["a", "b", "c"], |s| s.to_string());
        assert_eq!(rows, vec!["a", "b"]);
        let next = next.unwrap();
        assert_eq!(
            Paging::new(Some(2), Some(&next)).unwrap().after.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn last_page_has_no_token() {
        let p = Paging::new(Some(3), None).unwrap();
        let (rows, next) = p.finish(vec![1, 2, 3], |n| n.to_string());
        assert_eq!(rows.len(), 3);
        assert!(next.is_none());
    }

    #[test]
    fn bad_limits_and_tokens_are_validation_errors() {
        assert!(Paging::new(Some(0), None).is_err());
        assert!(Paging::new(Some(501), None).is_err());
        assert!(Paging::new(None, Some("%%%")).is_err());
        assert!(Paging::new(None, Some("__8")).is_err());
    }
}
