//! What every part of the API shares: the RFC 9457 problem body that
//! every error answer carries, with its field errors; the page wrapper and
//! paging parameters of lists; and the health answer.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Media type of every error answer (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem detail. `type` is stable per kind of error; clients
/// branch on it, never on `title` or `detail`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI reference naming the kind of problem, e.g. `/problems/not-found`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The request id (also in the `x-request-id` header), for support and the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Field-level validation errors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// For `quota-exceeded`: the resource whose limit was hit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// One page of a list. Pass `next_page_token` back as `page_token` for the next page;
/// it is absent on the last page.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1–500 (default 100).
    pub limit: Option<u32>,
    /// The `next_page_token` of the previous page.
    pub page_token: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_uses_rfc9457_member_names() {
        let p = Problem {
            kind: "/problems/not-found".into(),
            title: "Not found".into(),
            status: 404,
            detail: None,
            instance: None,
            request_id: None,
            errors: vec![],
            resource: None,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["type"], "/problems/not-found");
        assert!(v.get("detail").is_none());
        assert!(v.get("errors").is_none());
    }
}
