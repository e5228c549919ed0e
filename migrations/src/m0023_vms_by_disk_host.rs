//! Every agent's desired state asks which VMs' root disks its host holds
//! for another (`vms.disk_host_id`, while a disk moves): an index, so that
//! the question does not read every VM.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden, Clone, Copy)]
enum Vms {
    Table,
    DiskHostId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.create_index(
            Index::create()
                .name("vms_by_disk_host")
                .table(Vms::Table)
                .col(Vms::DiskHostId)
                .to_owned(),
        )
        .await
    }

    async fn down(&self, m: &SchemaManager) -> Result<(), DbErr> {
        m.drop_index(
            Index::drop()
                .name("vms_by_disk_host")
                .table(Vms::Table)
                .to_owned(),
        )
        .await
    }
}
