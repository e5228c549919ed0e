//! Two more per-tenant limits: disk (GiB over all VMs) and RoCE segments
//! (each holds one of the fabric's shared VLANs). Tenants that existed
//! before keep working: they get 100 GiB of disk per allowed VM and as
//! many RoCE segments as segments, which an administrator can then tighten.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum TenantQuotas {
    Table,
    DiskGib,
    RoceSegments,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            TenantQuotas::Table,
            vec![
                ColumnDef::new(TenantQuotas::DiskGib)
                    .big_integer()
                    .not_null()
                    .default(0)
                    .to_owned(),
                ColumnDef::new(TenantQuotas::RoceSegments)
                    .big_integer()
                    .not_null()
                    .default(0)
                    .to_owned(),
            ],
        )
        .await?;
        m.get_connection()
            .execute_unprepared(
                "UPDATE tenant_quotas SET \
                 disk_gib = CASE WHEN vms > 10000 THEN 1000000 ELSE vms * 100 END, \
                 roce_segments = segments",
            )
            .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(
            m,
            TenantQuotas::Table,
            &[TenantQuotas::DiskGib, TenantQuotas::RoceSegments],
        )
        .await
    }
}
