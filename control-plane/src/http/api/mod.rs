//! The REST API under `/api/v1`, and the OpenAPI document derived from it.
//! Every route is registered through `routes!`, so a handler cannot exist
//! without its entry in the document.

use std::collections::BTreeMap;

use kumo_api_types::{
    AuditEntry, FieldError, Health, Me, Member, MemberPut, Membership, Problem, Quota, Role,
    Tenant, TenantCreate, TenantUpdate, TokenCreate, TokenCreated, TokenInfo, User, UserCreate,
    UserKind, PROBLEM_JSON,
};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::context::AppState;

pub mod agent;
pub mod audit;
pub mod billing;
pub mod clusters;
pub mod consoles;
pub mod docs;
pub mod health;
pub mod hosts;
pub mod idle;
pub mod members;
pub mod public_net;
pub mod quota;
pub mod reservations;
pub mod segments;
pub mod shares;
pub mod templates;
pub mod tenants;
pub mod tokens;
pub mod users;
pub mod vms;
pub mod volumes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Kumo API",
        description = "Multi-tenant GPU cloud control plane. Errors are RFC 9457 problem+json; lists are paginated with `limit` and `page_token`; POSTs accept `Idempotency-Key`.",
        version = "1.0.0",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    components(schemas(
        Problem, FieldError, Tenant, TenantCreate, TenantUpdate, User, UserCreate, UserKind, Me,
        Membership, Member, MemberPut, Role, TokenCreate, TokenCreated, TokenInfo, Quota,
        AuditEntry, Health
    )),
    tags(
        (name = "tenants", description = "Research projects"),
        (name = "users", description = "People and service accounts"),
        (name = "members", description = "Who belongs to a tenant, with which role"),
        (name = "tokens", description = "API tokens"),
        (name = "quota", description = "Tenant limits"),
        (name = "audit", description = "Who did what"),
        (name = "hosts", description = "GPU hosts and their registration"),
        (name = "templates", description = "VM images"),
        (name = "vms", description = "Virtual machines and their lifecycle"),
        (name = "clusters", description = "Training clusters: VMs placed together, rail-aligned"),
        (name = "segments", description = "Tenant networks (VXLAN) for Ethernet and RoCE, and VM addresses on them"),
        (name = "public-ips", description = "Public addresses: pools, floating IPs and port forwards, carried by segment edges"),
        (name = "volumes", description = "Block volumes that outlive VMs, attached to VMs on their host"),
        (name = "shares", description = "Project shares: directories on the filesystem every host mounts, mounted into VMs with virtiofs"),
        (name = "reservations", description = "GPUs held for a project over a window, used by the VMs and clusters that name them"),
        (name = "idle", description = "Idle GPUs: a project's policy and webhook, its idle VMs, exemptions"),
        (name = "billing", description = "Rate cards, prepaid points, statements"),
        (name = "agent", description = "The protocol between host agents and the server"),
        (name = "health", description = "Liveness, readiness, metrics"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "host",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("kumoh_<host id>_<secret>")
                    .description(Some("A host's credential, for its agent"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("kumo_<id>_<secret>")
                    .build(),
            ),
        );
    }
}

/// The error answers every authenticated operation may give, documented once.
pub struct Problems;

impl utoipa::IntoResponses for Problems {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        [
            ("400", "Invalid request"),
            ("401", "Missing, invalid, expired or revoked token"),
            ("403", "The caller's role does not allow this"),
            ("404", "No such resource, or not visible to the caller"),
            ("409", "Conflicts with the current state"),
            ("413", "The request body is too large"),
            ("415", "The request body is not application/json"),
            ("422", "Idempotency-Key reused for a different request"),
        ]
        .into_iter()
        .map(|(status, description)| {
            let response = ResponseBuilder::new()
                .description(description)
                .content(
                    PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build();
            (status.to_owned(), RefOr::T(response))
        })
        .collect()
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(tenants::create, tenants::list))
        .routes(routes!(tenants::show, tenants::update, tenants::delete))
        .routes(routes!(users::create, users::list))
        .routes(routes!(users::me))
        .routes(routes!(users::disable))
        .routes(routes!(users::enable))
        .routes(routes!(users::end_sessions))
        .routes(routes!(members::list))
        .routes(routes!(members::put, members::remove))
        .routes(routes!(tokens::create, tokens::list))
        .routes(routes!(tokens::revoke))
        .routes(routes!(tokens::create_for_user))
        .routes(routes!(quota::show, quota::set))
        .routes(routes!(quota::guarantees))
        .routes(routes!(audit::list))
        .routes(routes!(hosts::create_join_token, hosts::list_join_tokens))
        .routes(routes!(hosts::revoke_join_token))
        .routes(routes!(hosts::rejoin))
        .routes(routes!(hosts::list))
        .routes(routes!(hosts::show))
        .routes(routes!(hosts::drain))
        .routes(routes!(hosts::maintenance, hosts::maintenance_done))
        .routes(routes!(hosts::undrain))
        .routes(routes!(hosts::devices))
        .routes(routes!(hosts::device_action))
        .routes(routes!(templates::create, templates::list))
        .routes(routes!(vms::create, vms::list))
        .routes(routes!(vms::show, vms::delete))
        .routes(routes!(vms::nccl_topology))
        .routes(routes!(vms::metrics))
        .routes(routes!(idle::show, idle::set, idle::reset))
        .routes(routes!(idle::report))
        .routes(routes!(idle::exempt, idle::unexempt))
        .routes(routes!(vms::start))
        .routes(routes!(vms::stop))
        .routes(routes!(vms::reboot))
        .routes(routes!(vms::shelve))
        .routes(routes!(vms::unshelve))
        .routes(routes!(vms::evacuate))
        .routes(routes!(vms::events))
        .routes(routes!(consoles::open))
        .routes(routes!(clusters::create, clusters::list))
        .routes(routes!(clusters::show, clusters::delete))
        .routes(routes!(clusters::repair))
        .routes(routes!(clusters::events))
        .routes(routes!(segments::create, segments::list))
        .routes(routes!(segments::show, segments::update, segments::delete))
        .routes(routes!(segments::set_ingress))
        .routes(routes!(public_net::create_pool, public_net::list_pools))
        .routes(routes!(public_net::delete_pool))
        .routes(routes!(public_net::allocate, public_net::list))
        .routes(routes!(public_net::show, public_net::release))
        .routes(routes!(public_net::attach))
        .routes(routes!(public_net::detach))
        .routes(routes!(
            public_net::create_forward,
            public_net::list_forwards
        ))
        .routes(routes!(public_net::delete_forward))
        .routes(routes!(volumes::create, volumes::list))
        .routes(routes!(volumes::show, volumes::delete))
        .routes(routes!(volumes::resize))
        .routes(routes!(volumes::attach))
        .routes(routes!(volumes::detach))
        .routes(routes!(volumes::move_to))
        .routes(routes!(volumes::create_snapshot, volumes::list_snapshots))
        .routes(routes!(volumes::delete_snapshot))
        .routes(routes!(reservations::create, reservations::list))
        .routes(routes!(reservations::show, reservations::delete))
        .routes(routes!(shares::create, shares::list))
        .routes(routes!(shares::show, shares::delete))
        .routes(routes!(shares::grow))
        .routes(routes!(shares::mount))
        .routes(routes!(shares::unmount))
        .routes(routes!(billing::put_rates, billing::get_rates))
        .routes(routes!(billing::grant))
        .routes(routes!(billing::points))
        .routes(routes!(billing::extend_grace))
        .routes(routes!(billing::statement))
        .routes(routes!(billing::usage))
        .routes(routes!(agent::register))
        .routes(routes!(agent::heartbeat))
        .routes(routes!(agent::desired))
        .routes(routes!(agent::status))
        .routes(routes!(agent::telemetry))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(health::fleet_metrics))
}

/// The OpenAPI document, as served at `/api/v1/openapi.json` and checked
/// in as `api-spec/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    router().split_for_parts().1
}

/// Pretty JSON of the document, with a trailing newline, exactly as checked in.
pub fn openapi_json() -> String {
    let mut s = openapi().to_pretty_json().unwrap_or_default();
    s.push('\n');
    s
}
