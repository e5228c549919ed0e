//! sea-orm models of the tables created in `kumo-migrations`.

pub mod api_tokens;
pub mod audit_log;
pub mod idempotency_keys;
pub mod memberships;
pub mod tenant_gpu_quotas;
pub mod tenant_quotas;
pub mod tenants;
pub mod users;
