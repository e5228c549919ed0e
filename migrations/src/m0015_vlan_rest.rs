//! A RoCE segment's VLAN rests after the segment is deleted, as its VNI
//! does: the released lease remembers the VLAN, so the leaf switches'
//! mapping of the old segment is gone before the VLAN carries another.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum VniLeases {
    Table,
    Vlan,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::add_columns(
            m,
            VniLeases::Table,
            vec![ColumnDef::new(VniLeases::Vlan).integer().null().to_owned()],
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        crate::drop_columns(m, VniLeases::Table, &[VniLeases::Vlan]).await
    }
}
