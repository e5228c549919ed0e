//! VMs of a tenant: create (placed at once, first fit), read, act, delete,
//! and their lifecycle events.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use kumo_api_types::{Page, PageParams, UnshelveParams, Vm, VmCreate, VmEvent};

use super::Problems;
use crate::app::vms::{act, view};
use crate::context::Actor;
use crate::context::AppState;
use crate::domain::lifecycle::Action;
use crate::error::ApiError;
use crate::http::extract::{Json, Path, Query};

/// Create a VM (members). It is placed at once (best fit, topology-aware)
/// and the host's agent brings it up; a guaranteed VM that does not fit
/// reclaims spot VMs and is `pending` until they are gone.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms", tag = "vms",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    request_body = VmCreate,
    responses((status = 201, description = "Created and placed", body = Vm), Problems)
)]
pub async fn create(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Json(body): Json<VmCreate>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, vm) = crate::app::vms::create(&st, &ctx, &tenant, &body).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(view(&st.db, &vm, &tenant.name).await?),
    ))
}

/// List a tenant's VMs by name (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<Vm>)), Problems)
)]
pub async fn list(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<Vm>>, ApiError> {
    Ok(axum::Json(
        crate::app::vms::list(&st, &ctx, &tenant, &q).await?,
    ))
}

/// Show a VM with its placement (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "The VM", body = Vm), Problems)
)]
pub async fn show(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<axum::Json<Vm>, ApiError> {
    Ok(axum::Json(
        crate::app::vms::show(&st, &ctx, &tenant, &vm).await?,
    ))
}

/// A VM's GPUs over time (any member): utilisation, memory, temperature,
/// power, ECC and throttle reasons, a point per step, from the guest's
/// `nvidia-smi` (advisory; never billed on). `telemetry` says whether the
/// guest answers (`unknown`: no guest agent or `nvidia-smi`).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}/metrics", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id"), kumo_api_types::MetricsQuery),
    responses((status = 200, description = "The VM's GPU series", body = kumo_api_types::VmMetrics), Problems)
)]
pub async fn metrics(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
    Query(q): Query<kumo_api_types::MetricsQuery>,
) -> Result<axum::Json<kumo_api_types::VmMetrics>, ApiError> {
    Ok(axum::Json(
        crate::app::gpu_telemetry::metrics(&st, &ctx, &tenant, &vm, &q).await?,
    ))
}

/// The NCCL topology file the guest gets (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/vms/{vm}/nccl-topology", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 200, description = "NCCL topology XML", body = String, content_type = "application/xml"), Problems)
)]
pub async fn nccl_topology(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let xml = crate::app::vms::nccl_topology(&st, &ctx, &tenant, &vm).await?;
    Ok(([(CONTENT_TYPE, "application/xml")], xml))
}

/// A lifecycle action and the VM as it is after it.
async fn acted(
    st: &AppState,
    actor: &Actor,
    tenant: &str,
    vm: &str,
    action: Action,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let (tenant, vm) = act(st, actor, tenant, vm, action).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(view(&st.db, &vm, &tenant.name).await?),
    ))
}

macro_rules! action_handler {
    ($fn:ident, $action:expr, $path:literal, $doc:literal) => {
        #[doc = $doc]
        #[utoipa::path(
            post, path = $path, tag = "vms",
            params(
                ("tenant" = String, Path, description = "Tenant name or id"),
                ("vm" = String, Path, description = "VM name or id"),
                ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
            ),
            responses((status = 202, description = "Accepted; the agent carries it out", body = Vm), Problems)
        )]
        pub async fn $fn(
            State(st): State<AppState>,
            ctx: Actor,
            Path((tenant, vm)): Path<(String, String)>,
        ) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
            acted(&st, &ctx, &tenant, &vm, $action).await
        }
    };
}

action_handler!(
    start,
    Action::Start,
    "/api/v1/tenants/{tenant}/vms/{vm}/start",
    "Start a stopped VM (members)."
);
action_handler!(
    stop,
    Action::Stop,
    "/api/v1/tenants/{tenant}/vms/{vm}/stop",
    "Shut a VM down (members)."
);
action_handler!(
    reboot,
    Action::Reboot,
    "/api/v1/tenants/{tenant}/vms/{vm}/reboot",
    "Reboot a running VM (members)."
);
action_handler!(
    shelve,
    Action::Shelve,
    "/api/v1/tenants/{tenant}/vms/{vm}/shelve",
    "Shelve a VM (members): shut it down and give back its GPUs, NICs, CPUs and memory, keeping its root disk and volumes on their host; charged for storage only."
);
/// Place a shelved VM again and start it (members): on the host holding
/// its disks, waiting as `pending` while that host has no room; with
/// `anywhere=true`, on any host with room, its root disk and volumes then
/// moved there (`scheduled`, its reason saying so, until they are whole).
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms/{vm}/unshelve", tag = "vms",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("vm" = String, Path, description = "VM name or id"),
        UnshelveParams,
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 202, description = "Accepted; the agent carries it out", body = Vm), Problems)
)]
pub async fn unshelve(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
    Query(q): Query<UnshelveParams>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let anywhere = q.anywhere.unwrap_or(false);
    let (tenant, vm) = crate::app::vms::unshelve(&st, &ctx, &tenant, &vm, anywhere).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(view(&st.db, &vm, &tenant.name).await?),
    ))
}

/// Delete a VM; its devices are freed once the host confirms (members).
#[utoipa::path(
    delete, path = "/api/v1/tenants/{tenant}/vms/{vm}", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), ("vm" = String, Path, description = "VM name or id")),
    responses((status = 202, description = "Deleting", body = Vm), Problems)
)]
pub async fn delete(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    acted(&st, &ctx, &tenant, &vm, Action::Delete).await
}

/// Lifecycle events of a tenant's VMs, newest first (any member).
#[utoipa::path(
    get, path = "/api/v1/tenants/{tenant}/events", tag = "vms",
    params(("tenant" = String, Path, description = "Tenant name or id"), PageParams),
    responses((status = 200, description = "One page", body = inline(Page<VmEvent>)), Problems)
)]
pub async fn events(
    State(st): State<AppState>,
    ctx: Actor,
    Path(tenant): Path<String>,
    Query(q): Query<PageParams>,
) -> Result<axum::Json<Page<VmEvent>>, ApiError> {
    Ok(axum::Json(
        crate::app::vms::events(&st, &ctx, &tenant, &q).await?,
    ))
}

/// Move a VM off a host with a maintenance window now (members): it is
/// shelved, then placed on another host with its disks, as the window
/// would do.
#[utoipa::path(
    post, path = "/api/v1/tenants/{tenant}/vms/{vm}/evacuate", tag = "vms",
    params(
        ("tenant" = String, Path, description = "Tenant name or id"),
        ("vm" = String, Path, description = "VM name or id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Replays the first answer for retries"),
    ),
    responses((status = 202, description = "Moving", body = Vm), Problems)
)]
pub async fn evacuate(
    State(st): State<AppState>,
    ctx: Actor,
    Path((tenant, vm)): Path<(String, String)>,
) -> Result<(StatusCode, axum::Json<Vm>), ApiError> {
    let v = crate::app::maintenance::evacuate(&st, &ctx, &tenant, &vm).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(v)))
}
