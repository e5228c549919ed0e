//! The limit on how fast one tenant reprograms shared hosts (see
//! `domain::churn`): operations that rewrite edges or hosts' network
//! tables take one change from the tenant's allowance first.

use crate::context::AppState;
use crate::entity::tenants;
use crate::error::ApiError;

/// One change to shared hosts for `tenant`, or a 429 saying when to try
/// again.
pub fn take(st: &AppState, tenant: &tenants::Model, what: &str) -> Result<(), ApiError> {
    let allowance = st.config.network.tenant_changes;
    st.churn
        .take(tenant.id, &allowance, st.config.clock.now())
        .map_err(|wait| ApiError::TooManyRequests {
            detail: format!(
                "tenant {:?} changes shared network hosts too fast ({what}): at most {} a minute, {} at once; try again in {wait} s",
                tenant.name, allowance.per_minute, allowance.burst
            ),
            retry_after_secs: wait,
        })
}
