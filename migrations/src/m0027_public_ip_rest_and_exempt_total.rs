//! Released public addresses rest before they are handed out again, and
//! the least recently used go first: `public_ip_releases` keeps when each
//! address was last given back (by address, not by pool, so a pool
//! deleted and made again does not forget) and by which tenant. A GPU VM's idle exemptions
//! are capped in total: `vm_idle.exempt_secs` is the exempt time it has
//! used or holds.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum PublicIpReleases {
    Table,
    Address,
    ReleasedAt,
    TenantId,
}

#[derive(DeriveIden, Clone, Copy)]
enum VmIdle {
    Table,
    ExemptSecs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(PublicIpReleases::Table)
                .col(
                    ColumnDef::new(PublicIpReleases::Address)
                        .string_len(15)
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(PublicIpReleases::ReleasedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                // Who gave it back (none for a segment's egress address):
                // a tenant's resting addresses are bounded by its quota.
                .col(ColumnDef::new(PublicIpReleases::TenantId).uuid().null())
                .to_owned(),
        )
        .await?;
        crate::add_columns(
            m,
            VmIdle::Table,
            vec![ColumnDef::new(VmIdle::ExemptSecs)
                .big_integer()
                .not_null()
                .default(0)
                .to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, VmIdle::Table, &[VmIdle::ExemptSecs]).await?;
        m.drop_table(Table::drop().table(PublicIpReleases::Table).to_owned())
            .await
    }
}
