//! sea-orm models of the tables created in `kumo-migrations`.

pub mod allocations;
pub mod api_tokens;
pub mod attachments;
pub mod audit_log;
pub mod billing_alerts;
pub mod charges;
pub mod clusters;
pub mod hosts;
pub mod idempotency_keys;
pub mod join_tokens;
pub mod memberships;
pub mod meter_runs;
pub mod point_grants;
pub mod rate_cards;
pub mod segments;
pub mod templates;
pub mod tenant_billing;
pub mod tenant_gpu_quotas;
pub mod tenant_quotas;
pub mod tenants;
pub mod users;
pub mod vm_events;
pub mod vms;
pub mod vni_leases;
