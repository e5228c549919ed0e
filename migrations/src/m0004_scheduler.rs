//! The scheduler's records: rails of a host's NICs, spot VMs' preemption
//! deadlines, and training clusters (placement groups) with their members.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Hosts {
    Table,
    Rails,
}

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Vms {
    Table,
    PreemptDeadline,
    ClusterId,
}

#[derive(DeriveIden)]
enum Clusters {
    Table,
    Id,
    TenantId,
    Name,
    Size,
    Spec,
    State,
    CreatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .add_column(ColumnDef::new(Hosts::Rails).text().null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Vms::Table)
                .add_column(
                    ColumnDef::new(Vms::PreemptDeadline)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Vms::Table)
                .add_column(ColumnDef::new(Vms::ClusterId).uuid().null())
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Clusters::Table)
                .col(ColumnDef::new(Clusters::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Clusters::TenantId).uuid().not_null())
                .col(ColumnDef::new(Clusters::Name).string_len(63).not_null())
                .col(ColumnDef::new(Clusters::Size).integer().not_null())
                .col(ColumnDef::new(Clusters::Spec).text().not_null())
                .col(ColumnDef::new(Clusters::State).string_len(16).not_null())
                .col(
                    ColumnDef::new(Clusters::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Clusters::Table, Clusters::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("clusters_tenant_name")
                .table(Clusters::Table)
                .col(Clusters::TenantId)
                .col(Clusters::Name)
                .unique()
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_table(Table::drop().table(Clusters::Table).to_owned())
            .await?;
        for col in [Vms::ClusterId, Vms::PreemptDeadline] {
            m.alter_table(Table::alter().table(Vms::Table).drop_column(col).to_owned())
                .await?;
        }
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .drop_column(Hosts::Rails)
                .to_owned(),
        )
        .await
    }
}
