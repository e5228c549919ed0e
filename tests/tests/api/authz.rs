//! The authorization matrix: every operation in the OpenAPI document ×
//! every kind of caller, with the exact status each must get. Outsiders
//! must not be able to tell a foreign tenant from one that does not exist.

use std::collections::BTreeSet;

use chrono::{Duration, Utc};
use kumo_api_types::{Problem, Role, TokenCreate};
use kumo_server::entity::api_tokens;
use reqwest::Method;
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde_json::{json, Value};

use crate::harness::{on_both_backends, Heartbeats, SimAgent, TestServer};

/// The callers, in the column order of the expectations below.
const CALLERS: [&str; 8] = [
    "admin", "owner", "member", "viewer", "outsider", "no token", "expired", "revoked",
];

struct World {
    tokens: [Option<String>; 8],
    serial: std::sync::atomic::AtomicU32,
    /// The public address the last call was given.
    last_ip: std::sync::Mutex<String>,
    /// The share the last call was given.
    last_share: std::sync::Mutex<String>,
    _hosts: Heartbeats,
}

impl World {
    async fn new(s: &TestServer) -> World {
        let (_, owner) = s.user("olga").await;
        let (_, member) = s.user("mika").await;
        let (_, viewer) = s.user("vera").await;
        let (_, outsider) = s.user("oscar").await;
        // Outsider is an owner elsewhere: a real, active user, just not of ours.
        s.tenant("beta").await;
        s.add("beta", "oscar", Role::Owner).await;
        s.tenant("alpha").await;
        s.add("alpha", "olga", Role::Owner).await;
        s.add("alpha", "mika", Role::Member).await;
        s.add("alpha", "vera", Role::Viewer).await;

        let expired = s
            .admin
            .create_token_for("olga", &TokenCreate::default())
            .await
            .unwrap();
        let row = api_tokens::Entity::find_by_id(expired.id)
            .one(s.db())
            .await
            .unwrap()
            .unwrap();
        let mut row: api_tokens::ActiveModel = row.into();
        row.expires_at = Set(Some(Utc::now() - Duration::seconds(1)));
        row.update(s.db()).await.unwrap();

        // A host, and a VM in alpha that stays `scheduled` (no agent acts).
        let host_1 = s.sim_agent("host-1", "hgx-h100").await;
        // Drained and undrained by the matrix; VMs land on host-1 meanwhile.
        let host_2 = s.sim_agent("host-2", "hgx-h100").await;
        let _: kumo_api_types::Vm = s
            .admin
            .post(
                "/api/v1/tenants/alpha/vms",
                &json!({"name": "alpha-vm", "vcpus": 1, "memory_gib": 1}),
            )
            .await
            .unwrap();
        let _: kumo_api_types::Segment = s
            .admin
            .post(
                "/api/v1/tenants/alpha/segments",
                &json!({"name": "alpha-seg", "kind": "ethernet", "cidr": "10.1.0.0/24"}),
            )
            .await
            .unwrap();
        // A VM with a NIC, a pool and an address of alpha's, for the
        // public networking operations.
        let host_3 = s.sim_agent_at("host-3", "cpu-only", "192.0.2.3").await;
        // It has the shared filesystem: it keeps the matrix's shares.
        assert!(host_3.heartbeat_with_shares().await.is_success());
        let _: kumo_api_types::Vm = s
            .admin
            .post(
                "/api/v1/tenants/alpha/vms",
                &json!({"name": "alpha-net", "vcpus": 1, "memory_gib": 1,
                        "networks": [{"segment": "alpha-seg"}]}),
            )
            .await
            .unwrap();
        let _: kumo_api_types::PublicIpPool = s
            .admin
            .post(
                "/api/v1/public-ip-pools",
                &json!({"name": "matrix", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1"}),
            )
            .await
            .unwrap();
        let _: kumo_api_types::Cluster = s
            .admin
            .post(
                "/api/v1/tenants/alpha/clusters",
                &json!({"name": "alpha-cl", "size": 2, "vcpus": 1, "memory_gib": 1}),
            )
            .await
            .unwrap();

        let revoked = s
            .admin
            .create_token_for("olga", &TokenCreate::default())
            .await
            .unwrap();
        s.client(Some(&revoked.token))
            .revoke_token(&revoked.id.to_string())
            .await
            .unwrap();

        World {
            tokens: [
                Some(s.admin_token.clone()),
                Some(owner),
                Some(member),
                Some(viewer),
                Some(outsider),
                None,
                Some(expired.token),
                Some(revoked.token),
            ],
            serial: Default::default(),
            last_ip: Default::default(),
            last_share: Default::default(),
            // The matrix runs longer than the lost-host timeout on a loaded
            // machine; a host marked unreachable midway refused a volume
            // move with 409 (the agents act on nothing: VMs stay put).
            _hosts: SimAgent::keep_beating(vec![host_1, host_2, host_3]),
        }
    }

    fn next(&self) -> u32 {
        self.serial
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// A tenant with the same members as `alpha`, for operations that
    /// destroy what they act on.
    async fn scratch_tenant(&self, s: &TestServer) -> String {
        let name = format!("scratch-{}", self.next());
        s.tenant(&name).await;
        s.add(&name, "olga", Role::Owner).await;
        s.add(&name, "mika", Role::Member).await;
        s.add(&name, "vera", Role::Viewer).await;
        name
    }
}

/// What one operation sends; built fresh for each caller.
struct Call {
    path: String,
    body: Option<Value>,
}

/// `(method, path template, expected statuses in CALLERS order)`.
const MATRIX: &[(&str, &str, [u16; 8])] = &[
    (
        "POST",
        "/api/v1/tenants",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants",
        [200, 200, 200, 200, 200, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PATCH",
        "/api/v1/tenants/{tenant}",
        [200, 200, 403, 403, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}",
        [204, 403, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/members",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/tenants/{tenant}/members/{user}",
        [201, 201, 403, 403, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/members/{user}",
        [204, 204, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/quota",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/rates",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/rates",
        [200, 200, 200, 200, 200, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/points/grants",
        [201, 403, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/points",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/tenants/{tenant}/points/grace",
        [200, 403, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/statements/{month}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/usage",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/tenants/{tenant}/quota",
        [200, 403, 403, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/users",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/users",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/users/me",
        [200, 200, 200, 200, 200, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/users/{user}/tokens",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tokens",
        [201, 201, 201, 201, 201, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tokens",
        [200, 200, 200, 200, 200, 401, 401, 401],
    ),
    // The target is a token of the owner's: only they and admins may revoke it.
    (
        "DELETE",
        "/api/v1/tokens/{id}",
        [204, 204, 404, 404, 404, 401, 401, 401],
    ),
    // Without `tenant`: admins all, owners (here also the outsider, owner of beta) their own.
    (
        "GET",
        "/api/v1/audit",
        [200, 200, 403, 403, 200, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/hosts/join-tokens",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    // The target is a user of its own for each call.
    (
        "POST",
        "/api/v1/users/{user}/disable",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/users/{user}/enable",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/users/{user}/sessions",
        [204, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/hosts/join-tokens",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/hosts/join-tokens/{id}",
        [204, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/hosts/{host}/rejoin",
        [204, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/hosts",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/hosts/{host}",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/hosts/{host}/drain",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    // A window far ahead, then called off.
    (
        "POST",
        "/api/v1/hosts/{host}/maintenance",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/hosts/{host}/maintenance",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/hosts/{host}/undrain",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/devices",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/guarantees",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/hosts/{host}/devices/{bdf}/{action}",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/templates",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/templates",
        [200, 200, 200, 200, 200, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/vms",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/vms/{vm}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/vms/{vm}",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/vms/{vm}/nccl-topology",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/vms/{vm}/metrics",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/idle-policy",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/tenants/{tenant}/idle-policy",
        [200, 200, 403, 403, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/idle-policy",
        [204, 204, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/idle-vms",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    // alpha-vm has no GPU: the idle policy does not apply to it (409).
    (
        "PUT",
        "/api/v1/tenants/{tenant}/vms/{vm}/idle-exemption",
        [409, 409, 403, 403, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/vms/{vm}/idle-exemption",
        [409, 409, 403, 403, 404, 401, 401, 401],
    ),
    // alpha-vm is `scheduled`: start and reboot are illegal (409) for those allowed to try.
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/start",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/stop",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/reboot",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    // A scheduled VM is neither shelved nor unshelved.
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/shelve",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    // Its host has no maintenance window.
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/evacuate",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/unshelve",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    // Writing on a console is for members; the VM must run.
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/console",
        [409, 409, 409, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/clusters",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/clusters",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/clusters/{cluster}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    // Repairing is for members; a healthy cluster has nothing to replace.
    (
        "POST",
        "/api/v1/tenants/{tenant}/clusters/{cluster}/repair",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/clusters/{cluster}/events",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/clusters/{cluster}",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/segments",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/segments",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/segments/{segment}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/segments/{segment}",
        [204, 204, 204, 403, 404, 401, 401, 401],
    ),
    (
        "PUT",
        "/api/v1/tenants/{tenant}/segments/{segment}/ingress",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "PATCH",
        "/api/v1/tenants/{tenant}/segments/{segment}",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    // Pools are the platform's.
    (
        "POST",
        "/api/v1/public-ip-pools",
        [201, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/public-ip-pools",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/public-ip-pools/{pool}",
        [204, 403, 403, 403, 403, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/public-ips",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/public-ips",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/public-ips/{address}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/public-ips/{address}",
        [204, 204, 204, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/public-ips/{address}/attach",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/public-ips/{address}/detach",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/port-forwards",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/port-forwards",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/port-forwards/{id}",
        [204, 204, 204, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/volumes",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/volumes/{volume}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/volumes/{volume}",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes/{volume}/resize",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes/{volume}/attach",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes/{volume}/detach",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes/{volume}/move",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots/{snapshot}",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/shares",
        [201, 201, 201, 403, 404, 401, 401, 401],
    ),
    // Owners reserve within their guarantee (alpha has none: 409).
    (
        "POST",
        "/api/v1/tenants/{tenant}/reservations",
        [201, 409, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/reservations",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/reservations/{reservation}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/reservations/{reservation}",
        [204, 204, 403, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/shares",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/shares/{share}",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/shares/{share}",
        [202, 202, 202, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/shares/{share}/grow",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "POST",
        "/api/v1/tenants/{tenant}/vms/{vm}/shares",
        [200, 200, 200, 403, 404, 401, 401, 401],
    ),
    (
        "DELETE",
        "/api/v1/tenants/{tenant}/vms/{vm}/shares/{share}",
        [204, 204, 204, 403, 404, 401, 401, 401],
    ),
    (
        "GET",
        "/api/v1/tenants/{tenant}/events",
        [200, 200, 200, 200, 404, 401, 401, 401],
    ),
    // The agent protocol takes host credentials (and join tokens) only.
    (
        "POST",
        "/agent/v1/register",
        [401, 401, 401, 401, 401, 401, 401, 401],
    ),
    (
        "POST",
        "/agent/v1/heartbeat",
        [401, 401, 401, 401, 401, 401, 401, 401],
    ),
    (
        "GET",
        "/agent/v1/desired",
        [401, 401, 401, 401, 401, 401, 401, 401],
    ),
    (
        "POST",
        "/agent/v1/status",
        [401, 401, 401, 401, 401, 401, 401, 401],
    ),
    (
        "POST",
        "/agent/v1/telemetry",
        [401, 401, 401, 401, 401, 401, 401, 401],
    ),
    ("GET", "/healthz", [200, 200, 200, 200, 200, 200, 200, 200]),
    ("GET", "/readyz", [200, 200, 200, 200, 200, 200, 200, 200]),
    ("GET", "/metrics", [200, 200, 200, 200, 200, 200, 200, 200]),
    // The fleet's series name its machines and their faults.
    (
        "GET",
        "/metrics/fleet",
        [200, 403, 403, 403, 403, 401, 401, 401],
    ),
];

async fn prepare(s: &TestServer, w: &World, method: &str, template: &str) -> Call {
    let n = w.next();
    let tenant = match (method, template) {
        ("DELETE", "/api/v1/tenants/{tenant}")
        | ("PUT", "/api/v1/tenants/{tenant}/members/{user}")
        | ("DELETE", "/api/v1/tenants/{tenant}/members/{user}") => w.scratch_tenant(s).await,
        _ => "alpha".to_owned(),
    };
    let host = if template.ends_with("drain")
        || template.ends_with("rejoin")
        || template.ends_with("maintenance")
        || template.contains("/devices/")
    {
        "host-2"
    } else {
        "host-1"
    };
    // Quarantining host-2's first GPU may be repeated: it is always allowed.
    let gpu = crate::harness::fixture_topology("hgx-h100").gpus[0]
        .location
        .bdf
        .to_string();
    let mut path = template
        .replace("{tenant}", &tenant)
        .replace("{host}", host)
        .replace("{bdf}", &gpu)
        .replace("{action}", "quarantine");
    let cluster = if (method, template) == ("DELETE", "/api/v1/tenants/{tenant}/clusters/{cluster}")
    {
        let name = format!("cl-{n}");
        let _: kumo_api_types::Cluster = s
            .admin
            .post(
                &format!("/api/v1/tenants/{tenant}/clusters"),
                &json!({"name": name, "size": 1, "vcpus": 1, "memory_gib": 1}),
            )
            .await
            .unwrap();
        name
    } else {
        "alpha-cl".to_owned()
    };
    path = path.replace("{cluster}", &cluster);
    path = path.replace("{month}", "2026-11");
    let segment = if (method, template) == ("DELETE", "/api/v1/tenants/{tenant}/segments/{segment}")
    {
        let name = format!("seg-{n}");
        let _: kumo_api_types::Segment = s
            .admin
            .post(
                &format!("/api/v1/tenants/{tenant}/segments"),
                &json!({"name": name, "kind": "ethernet", "cidr": "10.2.0.0/24"}),
            )
            .await
            .unwrap();
        name
    } else {
        "alpha-seg".to_owned()
    };
    path = path.replace("{segment}", &segment);
    // Operations that change a VM get one of their own; the rest use alpha-vm.
    let vm = match (method, template) {
        ("DELETE", "/api/v1/tenants/{tenant}/vms/{vm}")
        | ("POST", "/api/v1/tenants/{tenant}/vms/{vm}/stop") => {
            let name = format!("vm-{n}");
            let _: kumo_api_types::Vm = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/vms"),
                    &json!({"name": name, "vcpus": 1, "memory_gib": 1}),
                )
                .await
                .unwrap();
            name
        }
        _ => "alpha-vm".to_owned(),
    };
    path = path.replace("{vm}", &vm);
    // Public addresses: a fresh one of alpha's for what changes one.
    if template.contains("{address}") || template.ends_with("port-forwards") {
        let ip: kumo_api_types::PublicIp = s
            .admin
            .post(&format!("/api/v1/tenants/{tenant}/public-ips"), &json!({}))
            .await
            .unwrap();
        path = path.replace("{address}", &ip.address);
        w.last_ip.lock().unwrap().clone_from(&ip.address);
    }
    // Volumes: a fresh one of alpha's, on alpha-vm's host, made by its
    // host (available), for what changes one; attached for a detach.
    if template.contains("{volume}") {
        let name = format!("vol-{n}");
        let v: kumo_api_types::Volume = s
            .admin
            .post(
                &format!("/api/v1/tenants/{tenant}/volumes"),
                &json!({"name": name, "size_gib": 1, "vm": "alpha-vm"}),
            )
            .await
            .unwrap();
        let row = kumo_server::entity::volumes::ActiveModel {
            id: Set(v.id),
            state: Set("available".into()),
            ..Default::default()
        };
        row.update(s.db()).await.unwrap();
        if template.ends_with("detach") {
            let _: kumo_api_types::Volume = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/volumes/{name}/attach"),
                    &json!({"vm": "alpha-vm"}),
                )
                .await
                .unwrap();
        }
        if template.contains("{snapshot}") {
            let _: kumo_api_types::VolumeSnapshot = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/volumes/{name}/snapshots"),
                    &json!({"name": "first"}),
                )
                .await
                .unwrap();
            path = path.replace("{snapshot}", "first");
        }
        path = path.replace("{volume}", &name);
    }
    // Shares: a fresh one of alpha's, made by its keeper (available), for
    // what names or mounts one; mounted in alpha-vm for an unmount.
    let fresh_share = template.contains("{share}")
        || template.ends_with("/shares") && method == "POST" && template.contains("{vm}");
    if fresh_share {
        let name = format!("share-{n}");
        let sh: kumo_api_types::Share = s
            .admin
            .post(
                &format!("/api/v1/tenants/{tenant}/shares"),
                &json!({"name": name, "size_gib": 1}),
            )
            .await
            .unwrap();
        let row = kumo_server::entity::shares::ActiveModel {
            id: Set(sh.id),
            state: Set("available".into()),
            ..Default::default()
        };
        row.update(s.db()).await.unwrap();
        if template.ends_with("/shares/{share}") && template.contains("{vm}") {
            let _: kumo_api_types::Share = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/vms/alpha-vm/shares"),
                    &json!({"share": name}),
                )
                .await
                .unwrap();
        }
        path = path.replace("{share}", &name);
        w.last_share.lock().unwrap().clone_from(&name);
    }
    // Reservations: a fresh one of alpha's, an hour of its own (windows
    // never overlap, so none is refused for the GPUs promised).
    let window = |n: u32| {
        let start = Utc::now() + Duration::hours(i64::from(n) + 1);
        (start, start + Duration::minutes(30))
    };
    if template.contains("{reservation}") {
        let name = format!("res-{n}");
        let (from, to) = window(n);
        let _: kumo_api_types::Reservation = s
            .admin
            .post(
                &format!("/api/v1/tenants/{tenant}/reservations"),
                &json!({"name": name, "gpus": 8, "gpu_model": "H100-SXM5-80GB",
                        "starts_at": from, "ends_at": to}),
            )
            .await
            .unwrap();
        path = path.replace("{reservation}", &name);
    }
    let body = match (method, template) {
        ("POST", "/api/v1/tenants") => Some(json!({"name": format!("new-{n}")})),
        ("POST", "/api/v1/tenants/{tenant}/reservations") => {
            let (from, to) = window(n);
            Some(json!({"name": format!("made-res-{n}"), "gpus": 8,
                        "gpu_model": "H100-SXM5-80GB", "starts_at": from, "ends_at": to}))
        }
        ("POST", "/api/v1/tenants/{tenant}/shares") => {
            Some(json!({"name": format!("made-share-{n}"), "size_gib": 1}))
        }
        ("POST", "/api/v1/tenants/{tenant}/shares/{share}/grow") => Some(json!({"size_gib": 2})),
        ("POST", "/api/v1/tenants/{tenant}/vms/{vm}/shares") => {
            Some(json!({"share": w.last_share.lock().unwrap().clone()}))
        }
        ("POST", "/api/v1/tenants/{tenant}/volumes") => {
            Some(json!({"name": format!("made-{n}"), "size_gib": 1}))
        }
        ("POST", "/api/v1/tenants/{tenant}/volumes/{volume}/resize") => {
            Some(json!({"size_gib": 2}))
        }
        ("POST", "/api/v1/tenants/{tenant}/volumes/{volume}/attach") => {
            Some(json!({"vm": "alpha-vm"}))
        }
        ("POST", "/api/v1/tenants/{tenant}/volumes/{volume}/move") => {
            Some(json!({"host": "host-3"}))
        }
        ("POST", "/api/v1/hosts/{host}/devices/{bdf}/{action}") => {
            Some(json!({"reason": "authz matrix"}))
        }
        ("PUT", "/api/v1/tenants/{tenant}/idle-policy") => Some(json!({})),
        ("PUT", "/api/v1/tenants/{tenant}/vms/{vm}/idle-exemption") => Some(json!({
            "reason": "authz matrix",
            "until": Utc::now() + Duration::days(1),
        })),
        ("POST", "/api/v1/tenants/{tenant}/volumes/{volume}/snapshots") => {
            Some(json!({"name": format!("snap-{n}")}))
        }
        ("PATCH", "/api/v1/tenants/{tenant}/segments/{segment}") => {
            Some(json!({"egress": n.is_multiple_of(2)}))
        }
        ("POST", "/api/v1/public-ip-pools") => Some(json!({
            "name": format!("pool-{n}"),
            "cidr": format!("198.{}.{}.0/24", 18 + n / 256, n % 256),
            "gateway": format!("198.{}.{}.1", 18 + n / 256, n % 256),
        })),
        ("DELETE", "/api/v1/public-ip-pools/{pool}") => {
            let name = format!("gone-{n}");
            let _: kumo_api_types::PublicIpPool = s
                .admin
                .post(
                    "/api/v1/public-ip-pools",
                    &json!({"name": name, "cidr": format!("100.{}.{}.0/24", 128 + n / 256, n % 256),
                            "gateway": format!("100.{}.{}.1", 128 + n / 256, n % 256)}),
                )
                .await
                .unwrap();
            path = path.replace("{pool}", &name);
            None
        }
        ("POST", "/api/v1/tenants/{tenant}/public-ips") => Some(json!({})),
        ("POST", "/api/v1/tenants/{tenant}/public-ips/{address}/attach") => {
            // A NIC of its own: a NIC takes one floating address.
            let vm = format!("net-{n}");
            let _: kumo_api_types::Vm = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/vms"),
                    &json!({"name": vm, "vcpus": 1, "memory_gib": 1,
                            "networks": [{"segment": "alpha-seg"}]}),
                )
                .await
                .unwrap();
            Some(json!({"vm": vm}))
        }
        ("POST", "/api/v1/tenants/{tenant}/port-forwards") => Some(json!({
            "public_ip": w.last_ip.lock().unwrap().clone(), "protocol": "tcp",
            "public_port": 2222, "vm": "alpha-net", "private_port": 22,
        })),
        ("DELETE", "/api/v1/tenants/{tenant}/port-forwards/{id}") => {
            let ip: kumo_api_types::PublicIp = s
                .admin
                .post(&format!("/api/v1/tenants/{tenant}/public-ips"), &json!({}))
                .await
                .unwrap();
            let f: kumo_api_types::PortForward = s
                .admin
                .post(
                    &format!("/api/v1/tenants/{tenant}/port-forwards"),
                    &json!({"public_ip": ip.address, "protocol": "udp", "public_port": 53,
                            "vm": "alpha-net", "private_port": 53}),
                )
                .await
                .unwrap();
            path = path.replace("{id}", &f.id.to_string());
            None
        }
        ("PATCH", _) => Some(json!({"description": format!("edit {n}")})),
        ("PUT", "/api/v1/tenants/{tenant}/members/{user}") => {
            let user = format!("joiner-{n}");
            s.user(&user).await;
            path = path.replace("{user}", &user);
            Some(json!({"role": "viewer"}))
        }
        ("DELETE", "/api/v1/tenants/{tenant}/members/{user}") => {
            path = path.replace("{user}", "vera");
            None
        }
        ("PUT", "/api/v1/tenants/{tenant}/points/grace") => {
            Some(json!({"until": Utc::now() + Duration::days(3)}))
        }
        ("PUT", "/api/v1/rates") => {
            Some(json!({"prices": {"vcpu": {"guaranteed": "1.5", "spot": "0.5"}}}))
        }
        ("POST", "/api/v1/tenants/{tenant}/points/grants") => {
            Some(json!({"amount": "100", "expires_at": Utc::now() + Duration::days(30)}))
        }
        ("PUT", "/api/v1/tenants/{tenant}/quota") => Some(
            json!({"vcpus": 640, "memory_gib": 6400, "vms": 100, "disk_gib": 10000, "segments": 100, "roce_segments": 10, "public_ips": 1000, "volume_gib": 1000, "share_gib": 1000, "gpus": {"H100-SXM5-80GB": 8}}),
        ),
        ("POST", "/api/v1/users") => Some(json!({"name": format!("user-{n}")})),
        ("POST", "/api/v1/users/{user}/disable")
        | ("POST", "/api/v1/users/{user}/enable")
        | ("DELETE", "/api/v1/users/{user}/sessions") => {
            let user = format!("target-{n}");
            s.user(&user).await;
            path = path.replace("{user}", &user);
            None
        }
        ("POST", "/api/v1/users/{user}/tokens") => {
            path = path.replace("{user}", "mika");
            Some(json!({}))
        }
        ("POST", "/api/v1/tokens") => Some(json!({"description": "matrix"})),
        ("POST", "/api/v1/hosts/join-tokens") => Some(json!({})),
        ("POST", "/api/v1/templates") => Some(
            json!({"name": format!("tpl-{n}"), "image_path": "/images/base.qcow2", "os": "Debian 12", "default_user": "debian"}),
        ),
        ("POST", "/api/v1/tenants/{tenant}/vms") => {
            Some(json!({"name": format!("new-vm-{n}"), "vcpus": 1, "memory_gib": 1}))
        }
        ("POST", "/api/v1/tenants/{tenant}/segments") => {
            Some(json!({"name": format!("new-seg-{n}"), "kind": "roce", "cidr": "10.3.0.0/24"}))
        }
        ("PUT", "/api/v1/tenants/{tenant}/segments/{segment}/ingress") => {
            Some(json!({"rules": [{"protocol": "tcp", "ports": "22", "source": "0.0.0.0/0"}]}))
        }
        ("POST", "/api/v1/hosts/{host}/maintenance") => {
            Some(json!({"at": "2099-01-01T00:00:00Z", "reason": "authz matrix"}))
        }
        ("POST", "/api/v1/tenants/{tenant}/clusters") => {
            Some(json!({"name": format!("new-cl-{n}"), "size": 2, "vcpus": 1, "memory_gib": 1}))
        }
        ("POST", "/agent/v1/register") => Some(
            json!({"join_token": "kumoj_0123456789abcdef0123456789abcdef_nope", "name": "intruder", "topology": {"numa_nodes": [], "pci_devices": [], "gpus": [], "nics": [], "nvswitches": []}, "virt_type": "kvm"}),
        ),
        ("POST", "/agent/v1/heartbeat") => Some(json!({})),
        ("POST", "/agent/v1/status") => Some(json!({"vms": []})),
        ("POST", "/agent/v1/telemetry") => Some(json!({"vms": []})),
        ("DELETE", "/api/v1/hosts/join-tokens/{id}") => {
            let t: kumo_api_types::JoinTokenCreated = s
                .admin
                .post("/api/v1/hosts/join-tokens", &json!({}))
                .await
                .unwrap();
            path = path.replace("{id}", &t.id.to_string());
            None
        }
        ("DELETE", "/api/v1/tokens/{id}") => {
            let t = s
                .admin
                .create_token_for("olga", &TokenCreate::default())
                .await
                .unwrap();
            path = path.replace("{id}", &t.id.to_string());
            None
        }
        _ => None,
    };
    Call { path, body }
}

async fn send(s: &TestServer, method: &str, call: &Call, token: Option<&str>) -> reqwest::Response {
    let mut req = s.http().request(
        Method::from_bytes(method.as_bytes()).unwrap(),
        format!("{}{}", s.url, call.path),
    );
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = &call.body {
        req = req.json(b);
    }
    req.send().await.unwrap()
}

fn operations_in_openapi() -> BTreeSet<(String, String)> {
    let doc: Value = serde_json::from_str(&kumo_server::http::api::openapi_json()).unwrap();
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((method.to_uppercase(), path.clone()));
        }
    }
    ops
}

#[test]
fn the_matrix_covers_every_operation() {
    let in_matrix: BTreeSet<_> = MATRIX
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        in_matrix,
        operations_in_openapi(),
        "add new operations to the authorization matrix"
    );
}

on_both_backends! {
    async fn every_operation_for_every_caller(s: &TestServer) {
        let w = World::new(s).await;
        let mut failures = Vec::new();
        for (method, template, expected) in MATRIX {
            for (i, caller) in CALLERS.iter().enumerate() {
                let call = prepare(s, &w, method, template).await;
                let resp = send(s, method, &call, w.tokens[i].as_deref()).await;
                let status = resp.status().as_u16();
                if status != expected[i] {
                    let body = resp.text().await.unwrap_or_default();
                    failures.push(format!("{method} {} as {caller}: {status}, expected {} ({body})", call.path, expected[i]));
                    continue;
                }
                if status >= 400 {
                    let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
                    assert_eq!(ct, "application/problem+json", "{method} {} as {caller}", call.path);
                }
            }
        }
        assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    }

    async fn outsiders_cannot_tell_foreign_tenants_from_missing_ones(s: &TestServer) {
        let w = World::new(s).await;
        let outsider = w.tokens[4].as_deref();
        for (method, template, _) in MATRIX.iter().filter(|(_, p, _)| p.contains("{tenant}")) {
            let mut answers = Vec::new();
            for tenant in ["alpha", "no-such-tenant"] {
                let mut call = prepare(s, &w, method, template).await;
                call.path = template
                    .replace("{tenant}", tenant)
                    .replace("{user}", "vera")
                    .replace("{vm}", "alpha-vm")
                    .replace("{cluster}", "alpha-cl")
                    .replace("{segment}", "alpha-seg");
                let resp = send(s, method, &call, outsider).await;
                let status = resp.status().as_u16();
                let p: Problem = resp.json().await.unwrap();
                answers.push((status, p.kind, p.title, p.detail.map(|d| d.replace(tenant, "T"))));
            }
            assert_eq!(answers[0], answers[1], "{method} {template}");
            assert_eq!(answers[0].0, 404);
        }
        // Lists and the audit log show nothing of alpha to the outsider.
        let c = s.client(outsider);
        let names: Vec<_> = c.list_tenants().await.unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, vec!["beta"]);
        let audit = c.audit(None, 500).await.unwrap();
        assert!(!audit.is_empty());
        assert!(audit.iter().all(|e| e.tenant.as_deref() == Some("beta")), "{audit:?}");
        let me = serde_json::to_string(&c.me().await.unwrap()).unwrap();
        assert!(!me.contains("alpha"));
        // Nor does the audit log of alpha's owner mention beta.
        let owner_audit = s.client(w.tokens[1].as_deref()).audit(None, 500).await.unwrap();
        assert!(owner_audit.iter().all(|e| e.tenant.as_deref() != Some("beta")));
    }
}
