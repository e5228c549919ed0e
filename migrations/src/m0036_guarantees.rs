//! Guaranteed shares (issue 42): per tenant and GPU model, the GPUs the
//! platform promises beside the cap; and which VMs run above their
//! tenant's share (borrowed, and since when), so a tenant within its share can have them
//! reclaimed.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum TenantGpuQuotas {
    Table,
    Guarantee,
}

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    BorrowedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            TenantGpuQuotas::Table,
            vec![ColumnDef::new(TenantGpuQuotas::Guarantee)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            Vms::Table,
            vec![ColumnDef::new(Vms::BorrowedAt)
                .timestamp_with_time_zone()
                .null()
                .to_owned()],
        )
        .await?;
        // The marks pass asks whether any VM is marked, every second.
        m.create_index(
            Index::create()
                .name("vms_borrowed_at")
                .table(Vms::Table)
                .col(Vms::BorrowedAt)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name("vms_borrowed_at")
                .table(Vms::Table)
                .to_owned(),
        )
        .await?;
        crate::drop_columns(m, Vms::Table, &[Vms::BorrowedAt]).await?;
        crate::drop_columns(m, TenantGpuQuotas::Table, &[TenantGpuQuotas::Guarantee]).await
    }
}
