//! Cluster health and repair (issue 41): each cluster's health as last
//! assessed (`healthy`, `degraded`, `repairing`), what is wrong (JSON) and
//! since when, whether it repairs itself and after what delay, whether a
//! repair is under way; and the cluster's events.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Clusters {
    Table,
    Health,
    Problems,
    HealthSince,
    AutoRepair,
    RepairDelaySeconds,
    Repairing,
}

#[derive(DeriveIden, Clone, Copy)]
enum ClusterEvents {
    Table,
    Id,
    ClusterId,
    TenantId,
    At,
    Kind,
    Message,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Clusters::Table,
            vec![
                ColumnDef::new(Clusters::Health)
                    .string_len(16)
                    .not_null()
                    .default("healthy")
                    .to_owned(),
                ColumnDef::new(Clusters::Problems)
                    .text()
                    .not_null()
                    .default("[]")
                    .to_owned(),
                ColumnDef::new(Clusters::HealthSince)
                    .timestamp_with_time_zone()
                    .null()
                    .to_owned(),
                ColumnDef::new(Clusters::AutoRepair)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
                ColumnDef::new(Clusters::RepairDelaySeconds)
                    .integer()
                    .not_null()
                    .default(0)
                    .to_owned(),
                ColumnDef::new(Clusters::Repairing)
                    .boolean()
                    .not_null()
                    .default(false)
                    .to_owned(),
            ],
        )
        .await?;
        m.create_table(
            Table::create()
                .table(ClusterEvents::Table)
                .col(
                    ColumnDef::new(ClusterEvents::Id)
                        .big_integer()
                        .not_null()
                        .auto_increment()
                        .primary_key(),
                )
                // No foreign key: a cluster's events go with it in the
                // transaction that forgets it.
                .col(ColumnDef::new(ClusterEvents::ClusterId).uuid().not_null())
                .col(ColumnDef::new(ClusterEvents::TenantId).uuid().not_null())
                .col(
                    ColumnDef::new(ClusterEvents::At)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .col(
                    ColumnDef::new(ClusterEvents::Kind)
                        .string_len(32)
                        .not_null(),
                )
                .col(ColumnDef::new(ClusterEvents::Message).text().not_null())
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("cluster_events_by_cluster")
                .table(ClusterEvents::Table)
                .col(ClusterEvents::ClusterId)
                .col(ClusterEvents::Id)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(ClusterEvents::Table).to_owned())
            .await?;
        crate::drop_columns(
            m,
            Clusters::Table,
            &[
                Clusters::Health,
                Clusters::Problems,
                Clusters::HealthSince,
                Clusters::AutoRepair,
                Clusters::RepairDelaySeconds,
                Clusters::Repairing,
            ],
        )
        .await
    }
}
