//! Reaching VMs from outside and the outside from VMs: edge hosts (an
//! agent with an uplink), each segment's edge placement and egress switch,
//! public IP pools, tenants' public IPs (optionally a VM NIC's 1:1
//! floating address) and port forwards from a public address to a NIC.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Hosts {
    Table,
    EdgeUplink,
}

#[derive(DeriveIden, Clone, Copy)]
enum Segments {
    Table,
    Egress,
    EdgeHostId,
}

#[derive(DeriveIden, Clone, Copy)]
enum Tenants {
    Table,
    Id,
}

#[derive(DeriveIden, Clone, Copy)]
enum PublicIpPools {
    Table,
    Id,
    Name,
    Cidr,
    Gateway,
    First,
    Last,
    CreatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum PublicIps {
    Table,
    Id,
    PoolId,
    Address,
    TenantId,
    SegmentId,
    AttachmentId,
    CreatedAt,
}

#[derive(DeriveIden, Clone, Copy)]
enum PortForwards {
    Table,
    Id,
    TenantId,
    PublicIpId,
    Protocol,
    PublicPort,
    AttachmentId,
    PrivatePort,
    CreatedAt,
}

fn ts(col: impl IntoIden) -> ColumnDef {
    ColumnDef::new(col)
        .timestamp_with_time_zone()
        .not_null()
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            Hosts::Table,
            vec![ColumnDef::new(Hosts::EdgeUplink)
                .string_len(15)
                .null()
                .to_owned()],
        )
        .await?;
        crate::add_columns(
            m,
            Segments::Table,
            vec![
                ColumnDef::new(Segments::Egress)
                    .boolean()
                    .not_null()
                    .default(true)
                    .to_owned(),
                ColumnDef::new(Segments::EdgeHostId)
                    .uuid()
                    .null()
                    .to_owned(),
            ],
        )
        .await?;
        m.create_table(
            Table::create()
                .table(PublicIpPools::Table)
                .col(
                    ColumnDef::new(PublicIpPools::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(
                    ColumnDef::new(PublicIpPools::Name)
                        .string_len(63)
                        .not_null()
                        .unique_key(),
                )
                .col(
                    ColumnDef::new(PublicIpPools::Cidr)
                        .string_len(18)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(PublicIpPools::Gateway)
                        .string_len(15)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(PublicIpPools::First)
                        .string_len(15)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(PublicIpPools::Last)
                        .string_len(15)
                        .not_null(),
                )
                .col(ts(PublicIpPools::CreatedAt))
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(PublicIps::Table)
                .col(
                    ColumnDef::new(PublicIps::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(PublicIps::PoolId).uuid().not_null())
                .col(
                    ColumnDef::new(PublicIps::Address)
                        .string_len(15)
                        .not_null()
                        .unique_key(),
                )
                // A tenant's address, or (with `segment_id`) a segment
                // edge's egress address, which no tenant holds.
                .col(ColumnDef::new(PublicIps::TenantId).uuid().null())
                .col(ColumnDef::new(PublicIps::SegmentId).uuid().null())
                .col(ColumnDef::new(PublicIps::AttachmentId).uuid().null())
                .col(ts(PublicIps::CreatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(PublicIps::Table, PublicIps::PoolId)
                        .to(PublicIpPools::Table, PublicIpPools::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .foreign_key(
                    ForeignKey::create()
                        .from(PublicIps::Table, PublicIps::TenantId)
                        .to(Tenants::Table, Tenants::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        // One floating address per NIC.
        m.create_index(
            Index::create()
                .name("public_ips_attachment")
                .table(PublicIps::Table)
                .col(PublicIps::AttachmentId)
                .unique()
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name("public_ips_tenant")
                .table(PublicIps::Table)
                .col(PublicIps::TenantId)
                .to_owned(),
        )
        .await?;
        m.create_table(
            Table::create()
                .table(PortForwards::Table)
                .col(
                    ColumnDef::new(PortForwards::Id)
                        .uuid()
                        .not_null()
                        .primary_key(),
                )
                .col(ColumnDef::new(PortForwards::TenantId).uuid().not_null())
                .col(ColumnDef::new(PortForwards::PublicIpId).uuid().not_null())
                .col(
                    ColumnDef::new(PortForwards::Protocol)
                        .string_len(8)
                        .not_null(),
                )
                .col(
                    ColumnDef::new(PortForwards::PublicPort)
                        .integer()
                        .not_null(),
                )
                .col(ColumnDef::new(PortForwards::AttachmentId).uuid().not_null())
                .col(
                    ColumnDef::new(PortForwards::PrivatePort)
                        .integer()
                        .not_null(),
                )
                .col(ts(PortForwards::CreatedAt))
                .foreign_key(
                    ForeignKey::create()
                        .from(PortForwards::Table, PortForwards::PublicIpId)
                        .to(PublicIps::Table, PublicIps::Id)
                        .on_delete(ForeignKeyAction::Restrict),
                )
                .to_owned(),
        )
        .await?;
        // A public port forwards to one place.
        m.create_index(
            Index::create()
                .name("port_forwards_public")
                .table(PortForwards::Table)
                .col(PortForwards::PublicIpId)
                .col(PortForwards::Protocol)
                .col(PortForwards::PublicPort)
                .unique()
                .to_owned(),
        )
        .await?;
        Ok(())
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        for t in [
            PortForwards::Table.into_iden(),
            PublicIps::Table.into_iden(),
            PublicIpPools::Table.into_iden(),
        ] {
            m.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        crate::drop_columns(
            m,
            Segments::Table,
            &[Segments::EdgeHostId, Segments::Egress],
        )
        .await?;
        crate::drop_columns(m, Hosts::Table, &[Hosts::EdgeUplink]).await
    }
}
