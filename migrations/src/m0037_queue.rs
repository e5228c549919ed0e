//! The fair queue (issue 42): a queued VM's row (state `queued`) and its
//! standing here: when it was queued and leaves the queue unplaced, and
//! the position, reason and estimate the queue's last pass gave it.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum VmQueue {
    Table,
    VmId,
    TenantId,
    ClusterId,
    QueuedAt,
    ExpiresAt,
    Position,
    Reason,
    Estimate,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(VmQueue::Table)
                .col(
                    ColumnDef::new(VmQueue::VmId)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(VmQueue::TenantId).uuid().not_null())
                .col(ColumnDef::new(VmQueue::ClusterId).uuid().null())
                .col(
                    ColumnDef::new(VmQueue::QueuedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(VmQueue::ExpiresAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(ColumnDef::new(VmQueue::Position).integer().not_null())
                .col(ColumnDef::new(VmQueue::Reason).text().not_null())
                .col(
                    ColumnDef::new(VmQueue::Estimate)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(VmQueue::Table).to_owned())
            .await
    }
}
