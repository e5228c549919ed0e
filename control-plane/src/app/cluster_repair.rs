//! Cluster health and repair: each cluster's health assessed from its
//! members (level-triggered, on every replica; a change is written only
//! over what was read, so it is announced once), and failed members
//! replaced by new VMs of the same shape with the same names, addresses
//! and attachments, beside the others when there is room.
//!
//! A member is replaced in place: its row (name, NICs and addresses,
//! floating addresses, shares) stays and goes back to `pending` without
//! its host, devices or root disk, and the pending VMs' placement puts it
//! beside a placed sibling (same scalable unit and rails) when it can. The
//! old host, should it come back, finds the VM no longer its own and
//! removes its domain and disk before it starts anything, so no member
//! runs twice.

use std::collections::HashMap;

use kumo_api_types::{
    ClusterHealth, ClusterProblem, ClusterRepair, DeviceState, HostState, PageParams, Role, VmState,
};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
use serde_json::json;
use uuid::Uuid;

use crate::app::access::tenant_access;
use crate::app::audit;
use crate::context::{Actor, AppState};
use crate::domain::cluster_health::{assess, member_problems, repair_due, to_replace, MemberFacts};
use crate::domain::paging::Paging;
use crate::domain::states::decode;
use crate::entity::{clusters, tenants, vms};
use crate::error::ApiError;
use crate::store::clusters::member_index;
use crate::store::vms::stored_state;

/// What the rules need of a set of clusters, read in a few queries.
struct Members {
    by_cluster: HashMap<Uuid, Vec<vms::Model>>,
    hosts: HashMap<Uuid, (String, HostState)>,
    devices: HashMap<Uuid, Vec<(String, String, DeviceState)>>,
}

impl Members {
    async fn load(
        db: &impl sea_orm::ConnectionTrait,
        clusters: &[&clusters::Model],
        locked: Option<Vec<vms::Model>>,
    ) -> Result<Members, ApiError> {
        let ids: Vec<Uuid> = clusters.iter().map(|c| c.id).collect();
        let rows = match locked {
            Some(rows) => rows,
            None => crate::store::clusters::members_of_all(db, &ids).await?,
        };
        let hosts =
            crate::store::hosts::names_and_states(db, rows.iter().filter_map(|v| v.host_id))
                .await?;
        let vm_ids: Vec<Uuid> = rows.iter().map(|v| v.id).collect();
        let devices = crate::store::clusters::troubled_devices(db, &vm_ids).await?;
        let mut by_cluster: HashMap<Uuid, Vec<vms::Model>> = HashMap::new();
        for v in rows {
            if let Some(c) = v.cluster_id {
                by_cluster.entry(c).or_default().push(v);
            }
        }
        for c in clusters {
            if let Some(rows) = by_cluster.get_mut(&c.id) {
                rows.sort_by_key(|v| member_index(&c.name, &v.name));
            }
        }
        Ok(Members {
            by_cluster,
            hosts,
            devices,
        })
    }

    fn rows(&self, c: &clusters::Model) -> &[vms::Model] {
        self.by_cluster.get(&c.id).map_or(&[], Vec::as_slice)
    }

    fn facts(&self, c: &clusters::Model) -> Result<Vec<MemberFacts<'_>>, ApiError> {
        self.rows(c)
            .iter()
            .map(|v| {
                Ok(MemberFacts {
                    name: &v.name,
                    state: stored_state(v)?,
                    reason: v.reason.as_deref(),
                    host: v
                        .host_id
                        .and_then(|h| self.hosts.get(&h))
                        .map(|(n, s)| (n.as_str(), *s)),
                    devices: self
                        .devices
                        .get(&v.id)
                        .map(|d| {
                            d.iter()
                                .map(|(b, k, s)| (b.as_str(), k.as_str(), *s))
                                .collect()
                        })
                        .unwrap_or_default(),
                })
            })
            .collect()
    }
}

pub fn stored_problems(c: &clusters::Model) -> Result<Vec<ClusterProblem>, ApiError> {
    serde_json::from_str(&c.problems)
        .map_err(|e| ApiError::Internal(format!("cluster {} problems: {e}", c.id)))
}

pub fn stored_health(c: &clusters::Model) -> Result<ClusterHealth, ApiError> {
    decode("clusters", c.id, &c.health)
}

/// One pass over every cluster: health assessed and, where it changed,
/// written, announced (event, webhook); auto-repairing clusters due for
/// it repaired. One cluster's failure is logged and the pass goes on.
pub async fn pass(st: &AppState) -> Result<(), ApiError> {
    // Read through the read connections: on SQLite the one writer is the
    // creates' (the fleet simulator's creates waited 260 times a read's
    // median behind this pass when it read through the writer).
    let all = crate::store::clusters::all(&st.reads).await?;
    if all.is_empty() {
        return Ok(());
    }
    let refs: Vec<&clusters::Model> = all.iter().collect();
    let members = Members::load(&st.reads, &refs, None).await?;
    for c in &all {
        if let Err(e) = assess_one(st, &members, c).await {
            tracing::warn!(cluster = %c.id, error = %e, "cluster health not assessed");
        }
    }
    Ok(())
}

async fn assess_one(st: &AppState, members: &Members, c: &clusters::Model) -> Result<(), ApiError> {
    let now = st.config.clock.now();
    let facts = members.facts(c)?;
    if facts.is_empty() {
        return Ok(());
    }
    let a = assess(c.repairing, &facts);
    let was = stored_health(c)?;
    let problems =
        serde_json::to_string(&a.problems).map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut since = c.health_since;
    if a.health != was || problems != c.problems || a.repair_done {
        // From the last change of what is wrong, not only of the health:
        // a host lost while the cluster was degraded for another reason
        // (a member its owner stopped) waits out the whole delay too.
        since = Some(now);
        let repairing = c.repairing && !a.repair_done;
        if crate::store::clusters::set_health(&st.db, c, a.health, &problems, repairing, since)
            .await?
            && a.health != was
        {
            announce(st, c, was, a.health, &a.problems, now).await?;
        }
    }
    let delay = chrono::Duration::seconds(i64::from(c.repair_delay_seconds.max(0)));
    if c.auto_repair && repair_due(&a, since, delay, now) {
        let who = audit::Who {
            name: "auto-repair".into(),
            source_ip: "",
            request_id: "",
            client_request_id: None,
            at: now,
            tenant: None,
        };
        let done = replace_failed(st, c.id, &who).await?;
        if !done.replaced.is_empty() {
            tracing::info!(cluster = %c.name, members = ?done.replaced, "cluster repaired itself");
            place_now(st, c.id).await?;
        }
    }
    Ok(())
}

fn summary(problems: &[ClusterProblem]) -> String {
    problems
        .iter()
        .map(|p| format!("{}: {}", p.member, p.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A health change: the cluster's event and the project's webhook.
async fn announce(
    st: &AppState,
    c: &clusters::Model,
    was: ClusterHealth,
    now_is: ClusterHealth,
    problems: &[ClusterProblem],
    at: chrono::DateTime<chrono::Utc>,
) -> Result<(), ApiError> {
    let message = if problems.is_empty() {
        format!("{} → {}", was.as_str(), now_is.as_str())
    } else {
        format!(
            "{} → {}: {}",
            was.as_str(),
            now_is.as_str(),
            summary(problems)
        )
    };
    crate::store::clusters::event(&st.db, c, at, now_is.as_str(), message.clone()).await?;
    let project = tenants::Entity::find_by_id(c.tenant_id)
        .one(&st.db)
        .await?
        .map(|t| t.name)
        .unwrap_or_default();
    crate::app::webhooks::notify(
        st,
        c.tenant_id,
        "cluster.health",
        json!({
            "text": format!("Kumo: cluster {} of project {project}: {message}", c.name),
            "event": "cluster.health",
            "project": project,
            "cluster": c.name,
            "cluster_id": c.id,
            "health": now_is,
            "was": was,
            "problems": problems,
            "at": at,
        }),
    );
    Ok(())
}

/// What [`replace_failed`] did.
pub struct Replaced {
    pub replaced: Vec<String>,
    pub left: Vec<ClusterProblem>,
}

/// Replaces the cluster's failed members (one transaction over its locked
/// members, re-assessed there, so two replicas repairing at once replace
/// each member once): each goes back to `pending` off its host, with its
/// name, NICs and addresses, for a new VM of the same shape on a fresh
/// root disk. Answers who was replaced, and the trouble left alone.
pub async fn replace_failed(
    st: &AppState,
    cluster: Uuid,
    who: &audit::Who<'_>,
) -> Result<Replaced, ApiError> {
    let now = st.config.clock.now();
    let txn = st.db.begin().await?;
    let c = crate::store::clusters::by_id(&txn, cluster)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("cluster {cluster}")))?;
    let locked = crate::store::clusters::members_to_change(&txn, c.id).await?;
    let members = Members::load(&txn, &[&c], Some(locked)).await?;
    let facts = members.facts(&c)?;
    let names = to_replace(&facts);
    let left: Vec<ClusterProblem> = facts
        .iter()
        .filter(|m| !names.contains(&m.name))
        .flat_map(|m| member_problems(m, false))
        .collect();
    if names.is_empty() {
        return Ok(Replaced {
            replaced: Vec::new(),
            left,
        });
    }
    let mut wake: Vec<Uuid> = Vec::new();
    let mut why_all = Vec::new();
    for (vm, f) in members.rows(&c).iter().zip(&facts) {
        if !names.contains(&f.name) {
            continue;
        }
        let why = member_problems(f, false)
            .into_iter()
            .filter(|p| p.fault.replaceable())
            .map(|p| p.detail)
            .collect::<Vec<_>>()
            .join("; ");
        why_all.push(format!("{} ({why})", vm.name));
        wake.extend(crate::app::host_loss::replace_off_host(&txn, vm, &why, &who.name, now).await?);
    }
    crate::store::clusters::mark_repairing(&txn, c.id).await?;
    let message = format!("by {}: replacing {}", who.name, why_all.join(", "));
    crate::store::clusters::event(&txn, &c, now, "repair", message).await?;
    let tenant = tenants::Entity::find_by_id(c.tenant_id).one(&txn).await?;
    let who = audit::Who {
        name: who.name.clone(),
        tenant: who.tenant.or(tenant.as_ref()),
        ..*who
    };
    audit::record_by(&txn, &who, "cluster.repair", &c.name).await?;
    txn.commit().await?;
    wake.sort();
    wake.dedup();
    for h in wake {
        st.signals.notify(h);
    }
    Ok(Replaced {
        replaced: names.into_iter().map(str::to_owned).collect(),
        left,
    })
}

/// The cluster's pending members placed now rather than at the next pass.
pub async fn place_now(st: &AppState, cluster: Uuid) -> Result<(), ApiError> {
    let rows = vms::Entity::find()
        .filter(vms::Column::ClusterId.eq(cluster))
        .filter(vms::Column::State.eq(VmState::Pending.as_str()))
        .all(&st.db)
        .await?;
    crate::app::admission::admit_pending(st, Some(cluster), &rows).await
}

/// After members were placed beside a sibling: where each went, said
/// in the cluster's events, and whether it is in the sibling's scalable
/// unit (a repair keeps the unit when it has room).
pub async fn placed_near(
    st: &AppState,
    cluster: Uuid,
    ids: &[Uuid],
    near: &crate::app::admission::Near,
) -> Result<(), ApiError> {
    let Some(c) = crate::store::clusters::by_id(&st.db, cluster).await? else {
        return Ok(());
    };
    if !c.repairing {
        return Ok(());
    }
    let rows = vms::Entity::find()
        .filter(vms::Column::Id.is_in(ids.iter().copied()))
        .all(&st.db)
        .await?;
    let mut host_ids: Vec<Uuid> = rows.iter().filter_map(|v| v.host_id).collect();
    host_ids.push(near.host);
    let hosts: HashMap<Uuid, _> = crate::store::hosts::by_ids(&st.db, host_ids)
        .await?
        .into_iter()
        .map(|h| (h.id, h))
        .collect();
    let unit = hosts.get(&near.host).and_then(|h| h.scalable_unit.clone());
    let now = st.config.clock.now();
    for v in &rows {
        let Some(h) = v.host_id.and_then(|h| hosts.get(&h)) else {
            continue;
        };
        let message = match (&unit, &h.scalable_unit) {
            (Some(want), Some(got)) if want == got => {
                format!("{} placed on {} in scalable unit {got}", v.name, h.name)
            }
            (Some(want), got) => format!(
                "{} placed on {} outside scalable unit {want} ({}): no room there",
                v.name,
                h.name,
                got.as_deref().unwrap_or("no unit")
            ),
            (None, _) => format!("{} placed on {}", v.name, h.name),
        };
        crate::store::clusters::event(&st.db, &c, now, "repair-placed", message).await?;
    }
    Ok(())
}

/// A member repairs a cluster: its failed members replaced (host lost,
/// VM in error, a device quarantined) and placed now where there is room.
pub async fn repair(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    cluster: &str,
) -> Result<ClusterRepair, ApiError> {
    let (tenant, access) = tenant_access(&st.db, &actor.caller, tenant).await?;
    access.require(Role::Member, "repairing clusters")?;
    let c = crate::store::clusters::find(&st.db, &tenant, cluster).await?;
    let who = audit::Who {
        name: actor.caller.user.name.clone(),
        source_ip: &actor.source_ip,
        request_id: &actor.request_id,
        client_request_id: actor.client_request_id.as_deref(),
        at: actor.at,
        tenant: Some(&tenant),
    };
    let done = replace_failed(st, c.id, &who).await?;
    if !done.replaced.is_empty() {
        place_now(st, c.id).await?;
    }
    let row = crate::store::clusters::by_id(&st.db, c.id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("cluster {cluster:?}")))?;
    Ok(ClusterRepair {
        replaced: done.replaced,
        left: done.left,
        cluster: crate::app::clusters::view(st, &st.db, &row, &tenant.name).await?,
    })
}

/// One page of a cluster's events, newest first (any member).
pub async fn events(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    cluster: &str,
    params: &PageParams,
) -> Result<kumo_api_types::Page<kumo_api_types::ClusterEvent>, ApiError> {
    let (tenant, _) = tenant_access(&st.db, &actor.caller, tenant).await?;
    let c = crate::store::clusters::find(&st.db, &tenant, cluster).await?;
    let paging = Paging::new(params.limit, params.page_token.as_deref())?;
    let before = paging.before_id()?;
    let rows = crate::store::clusters::events_page(&st.db, c.id, before, &paging).await?;
    let (rows, next) = paging.finish(rows, |e| e.id.to_string());
    Ok(kumo_api_types::Page {
        items: rows
            .into_iter()
            .map(|e| kumo_api_types::ClusterEvent {
                id: e.id,
                at: e.at,
                kind: e.kind,
                message: e.message,
            })
            .collect(),
        next_page_token: next,
    })
}
