//! Schema migrations of Kumo's database. Each migration is written once with
//! sea-query's schema builder and runs unchanged on SQLite and PostgreSQL.

pub use sea_orm_migration::prelude::*;

mod m0001_foundation;
mod m0002_hosts_vms;
mod m0003_kernel_boot_and_guest_condition;
mod m0004_scheduler;
mod m0005_host_drain;
mod m0006_segments;
mod m0007_host_networks;
mod m0008_billing;
mod m0009_sso;
mod m0010_session_logout;
mod m0011_device_logins;
mod m0012_topology_digest;
mod m0013_host_credentials;
mod m0014_credential_lifecycle;
mod m0015_vlan_rest;
mod m0016_segment_faults;
mod m0017_client_request_ids;
mod m0018_disk_and_roce_quota;
mod m0019_public_networking;
mod m0020_volumes;
mod m0021_volume_moves;
mod m0022_root_disk_moves;
mod m0023_vms_by_disk_host;
mod m0024_device_health;
mod m0025_gpu_telemetry;
mod m0026_idle_gpus;
mod m0027_public_ip_rest_and_exempt_total;
mod m0028_host_storage;
mod m0029_gpu_hours;
mod m0030_console_relay;
mod m0031_shares;
mod m0032_cluster_health;
mod m0033_lost_vms;
mod m0034_maintenance;
mod m0035_spares_and_notices;
mod m0036_guarantees;
mod m0037_queue;
mod m0038_reservations;

/// Adds columns to `table`, one statement each: SQLite alters one column
/// at a time.
pub(crate) async fn add_columns(
    m: &SchemaManager<'_>,
    table: impl IntoIden + Clone + 'static,
    columns: Vec<ColumnDef>,
) -> Result<(), DbErr> {
    for mut c in columns {
        m.alter_table(
            Table::alter()
                .table(table.clone())
                .add_column(&mut c)
                .to_owned(),
        )
        .await?;
    }
    Ok(())
}

/// Drops columns of `table`, one statement each.
pub(crate) async fn drop_columns<C: IntoIden + Clone + 'static>(
    m: &SchemaManager<'_>,
    table: impl IntoIden + Clone + 'static,
    columns: &[C],
) -> Result<(), DbErr> {
    for c in columns {
        m.alter_table(
            Table::alter()
                .table(table.clone())
                .drop_column(c.clone())
                .to_owned(),
        )
        .await?;
    }
    Ok(())
}

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m0001_foundation::Migration),
            Box::new(m0002_hosts_vms::Migration),
            Box::new(m0003_kernel_boot_and_guest_condition::Migration),
            Box::new(m0004_scheduler::Migration),
            Box::new(m0005_host_drain::Migration),
            Box::new(m0006_segments::Migration),
            Box::new(m0007_host_networks::Migration),
            Box::new(m0008_billing::Migration),
            Box::new(m0009_sso::Migration),
            Box::new(m0010_session_logout::Migration),
            Box::new(m0011_device_logins::Migration),
            Box::new(m0012_topology_digest::Migration),
            Box::new(m0013_host_credentials::Migration),
            Box::new(m0014_credential_lifecycle::Migration),
            Box::new(m0015_vlan_rest::Migration),
            Box::new(m0016_segment_faults::Migration),
            Box::new(m0017_client_request_ids::Migration),
            Box::new(m0018_disk_and_roce_quota::Migration),
            Box::new(m0019_public_networking::Migration),
            Box::new(m0020_volumes::Migration),
            Box::new(m0021_volume_moves::Migration),
            Box::new(m0022_root_disk_moves::Migration),
            Box::new(m0023_vms_by_disk_host::Migration),
            Box::new(m0024_device_health::Migration),
            Box::new(m0025_gpu_telemetry::Migration),
            Box::new(m0026_idle_gpus::Migration),
            Box::new(m0027_public_ip_rest_and_exempt_total::Migration),
            Box::new(m0028_host_storage::Migration),
            Box::new(m0029_gpu_hours::Migration),
            Box::new(m0030_console_relay::Migration),
            Box::new(m0031_shares::Migration),
            Box::new(m0032_cluster_health::Migration),
            Box::new(m0033_lost_vms::Migration),
            Box::new(m0034_maintenance::Migration),
            Box::new(m0035_spares_and_notices::Migration),
            Box::new(m0036_guarantees::Migration),
            Box::new(m0037_queue::Migration),
            Box::new(m0038_reservations::Migration),
        ]
    }
}
