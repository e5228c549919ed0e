//! Tenant networks: segments with their VNI, the VNI leases that keep a
//! VNI with one live segment (and resting a while after), and VM
//! attachments with their address and MAC.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum Segments {
    Table,
    Id,
    TenantId,
    Name,
    Kind,
    Cidr,
    Gateway,
    Mtu,
    Vni,
    CreatedAt,
}

#[derive(DeriveIden)]
enum VniLeases {
    Table,
    Vni,
    SegmentId,
    ReleasedAt,
}

#[derive(DeriveIden)]
enum Attachments {
    Table,
    Id,
    VmId,
    SegmentId,
    Ip,
    Mac,
    CreatedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_table(
            Table::create()
                .table(Segments::Table)
                .col(ColumnDef::new(Segments::Id).uuid().not_null().primary_key())
                .col(ColumnDef::new(Segments::TenantId).uuid().not_null())
                .col(ColumnDef::new(Segments::Name).string_len(63).not_null())
                .col(ColumnDef::new(Segments::Kind).string_len(16).not_null())
                .col(ColumnDef::new(Segments::Cidr).string_len(43).not_null())
                .col(ColumnDef::new(Segments::Gateway).string_len(39).not_null())
                .col(ColumnDef::new(Segments::Mtu).integer().not_null())
                .col(ColumnDef::new(Segments::Vni).integer().not_null())
                .col(
                    ColumnDef::new(Segments::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Segments::Table, Segments::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("segments_tenant_name")
                .table(Segments::Table)
                .col(Segments::TenantId)
                .col(Segments::Name)
                .unique()
                .to_owned(),
        )
        .await?;
        // A live segment's VNI is unique here too: the lease is the arbiter.
        m.create_index(
            Index::create()
                .name("segments_vni")
                .table(Segments::Table)
                .col(Segments::Vni)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(VniLeases::Table)
                .col(
                    ColumnDef::new(VniLeases::Vni)
                        .integer()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(VniLeases::SegmentId).uuid().null())
                .col(
                    ColumnDef::new(VniLeases::ReleasedAt)
                        .timestamp_with_time_zone()
                        .null(),
                )
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(Attachments::Table)
                .col(
                    ColumnDef::new(Attachments::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(Attachments::VmId).uuid().not_null())
                .col(ColumnDef::new(Attachments::SegmentId).uuid().not_null())
                .col(ColumnDef::new(Attachments::Ip).string_len(39).not_null())
                .col(ColumnDef::new(Attachments::Mac).string_len(17).not_null())
                .col(
                    ColumnDef::new(Attachments::CreatedAt)
                        .timestamp_with_time_zone()
                        .not_null(),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(Attachments::Table, Attachments::SegmentId)
                        .to(Segments::Table, Segments::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        for (name, cols) in [
            (
                "attachments_segment_ip",
                vec![Attachments::SegmentId, Attachments::Ip],
            ),
            ("attachments_mac", vec![Attachments::Mac]),
        ] {
            let mut idx = Index::create();
            idx.name(name).table(Attachments::Table).unique();
            for c in cols {
                idx.col(c);
            }
            m.create_index(idx.to_owned()).await?;
        }
        m.create_index(
            Index::create()
                .name("attachments_vm")
                .table(Attachments::Table)
                .col(Attachments::VmId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            Attachments::Table.into_iden(),
            VniLeases::Table.into_iden(),
            Segments::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
