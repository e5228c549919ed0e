//! The allocation rows of a placement: one per GPU, NIC and CPU, keyed so
//! the database refuses a device held twice. (Where VMs go is
//! `kumo-scheduler`'s business.)

use kumo_topology::guest_layout::Placement;
use sea_orm::Set;
use uuid::Uuid;

use crate::domain::states::{AllocationKind, StoredText};
use crate::entity::allocations;

/// The allocation rows a placement needs: `(kind, key)`.
pub fn allocations(p: &Placement) -> Vec<(AllocationKind, String)> {
    let mut rows: Vec<(AllocationKind, String)> = p
        .gpus
        .iter()
        .map(|g| (AllocationKind::Gpu, g.to_string()))
        .collect();
    rows.extend(
        p.nics
            .iter()
            .map(|n| (AllocationKind::Nic, n.physical().to_string())),
    );
    rows.extend(
        p.cpus
            .values()
            .flatten()
            .map(|c| (AllocationKind::Cpu, c.to_string())),
    );
    rows
}

/// The rows to insert for a VM's placement on a host.
pub fn rows(host: Uuid, vm: Uuid, p: &Placement) -> Vec<allocations::ActiveModel> {
    allocations(p)
        .into_iter()
        .map(|(kind, key)| allocations::ActiveModel {
            host_id: Set(host),
            kind: Set(kind.to_text().to_owned()),
            key: Set(key),
            vm_id: Set(vm),
        })
        .collect()
}

/// Lets go of some of a VM's devices of one kind (by key), in the
/// caller's transaction.
pub async fn release_some(
    db: &impl sea_orm::ConnectionTrait,
    vm: Uuid,
    kind: AllocationKind,
    keys: &[String],
) -> Result<(), crate::error::ApiError> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    allocations::Entity::delete_many()
        .filter(allocations::Column::VmId.eq(vm))
        .filter(allocations::Column::Kind.eq(kind.to_text()))
        .filter(allocations::Column::Key.is_in(keys.iter().cloned()))
        .exec(db)
        .await?;
    Ok(())
}

/// Lets go of every device, CPU and memory a VM holds, in the caller's
/// transaction.
pub async fn release_all(
    db: &impl sea_orm::ConnectionTrait,
    vm: Uuid,
) -> Result<(), crate::error::ApiError> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    allocations::Entity::delete_many()
        .filter(allocations::Column::VmId.eq(vm))
        .exec(db)
        .await?;
    Ok(())
}
