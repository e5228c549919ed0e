//! Tenant networks reach the hosts: each host's underlay address (its VXLAN
//! tunnel endpoint, one host per address), a revision of its network part
//! of the desired state (bumped when another host's VMs join or leave a
//! segment it shares, without touching the revision placement commits
//! check), what its agent last found of its RoCE ports, each segment's
//! ingress rules, and RoCE segments' VLANs.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Hosts {
    Table,
    UnderlayIp,
    NetworkRevision,
    Fabric,
}

#[derive(DeriveIden)]
enum Segments {
    Table,
    IngressRules,
    Vlan,
}

const UNDERLAY_INDEX: &str = "hosts_underlay_ip_key";
const VLAN_INDEX: &str = "segments_vlan_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .add_column(ColumnDef::new(Hosts::UnderlayIp).string_len(45).null())
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .add_column(
                    ColumnDef::new(Hosts::NetworkRevision)
                        .big_integer()
                        .not_null()
                        .default(0),
                )
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Hosts::Table)
                .add_column(ColumnDef::new(Hosts::Fabric).text().null())
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name(UNDERLAY_INDEX)
                .table(Hosts::Table)
                .col(Hosts::UnderlayIp)
                .unique()
                .to_owned(),
        )
        .await?;
        m.alter_table(
            Table::alter()
                .table(Segments::Table)
                .add_column(ColumnDef::new(Segments::IngressRules).text().null())
                .to_owned(),
        )
        .await?;
        // A RoCE segment's VLAN on the leaf switches: one segment each.
        m.alter_table(
            Table::alter()
                .table(Segments::Table)
                .add_column(ColumnDef::new(Segments::Vlan).integer().null())
                .to_owned(),
        )
        .await?;
        m.create_index(
            Index::create()
                .name(VLAN_INDEX)
                .table(Segments::Table)
                .col(Segments::Vlan)
                .unique()
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name(VLAN_INDEX)
                .table(Segments::Table)
                .to_owned(),
        )
        .await?;
        for col in [Segments::Vlan, Segments::IngressRules] {
            m.alter_table(
                Table::alter()
                    .table(Segments::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        m.drop_index(
            Index::drop()
                .name(UNDERLAY_INDEX)
                .table(Hosts::Table)
                .to_owned(),
        )
        .await?;
        for col in [Hosts::Fabric, Hosts::NetworkRevision, Hosts::UnderlayIp] {
            m.alter_table(
                Table::alter()
                    .table(Hosts::Table)
                    .drop_column(col)
                    .to_owned(),
            )
            .await?;
        }
        Ok(())
    }
}
